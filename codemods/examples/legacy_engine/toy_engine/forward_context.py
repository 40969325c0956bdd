"""The engine's OWN forward context: unrelated to the graph layer's, and never migrated."""

from dataclasses import dataclass, field


@dataclass
class ForwardContext:
    """Per-request bookkeeping of the toy engine."""

    request_ids: list = field(default_factory=list)


_current = ForwardContext()


def get_forward_context() -> ForwardContext:
    """The engine's current context."""
    return _current
