"""The forward context: what a registered op (the engine's attention) reads about the step being run.

An op called from inside a captured model cannot take the batch as an argument without changing the model's
signature, so the caller sets a ``ForwardContext`` around each forward (and around each replay, since eager breaks
re-run the op then) and the op reads it with ``get_forward_context()``.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ForwardContext:
    """Per-step state a registered op reads: the batch, the attention backend, and anything else under ``extra``."""

    forward_batch: Any = None
    attn_backend: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


_FORWARD_CONTEXT: ContextVar[ForwardContext | None] = ContextVar("cudagraph_forward_context", default=None)


class ForwardContextScope:
    """A reusable ``with`` block that makes one ``ForwardContext`` current: what ``set_forward_context`` returns.

    A runner keeps one per captured shape and enters it around every replay, so a step allocates nothing to set the
    context. One scope may not be entered again before it is exited (scopes of different contexts nest freely).
    """

    __slots__ = ("_token", "context")

    def __init__(self, context: ForwardContext) -> None:
        self.context = context
        self._token: Token[ForwardContext | None] | None = None

    def __enter__(self) -> ForwardContext:
        if self._token is not None:
            raise RuntimeError(
                "this forward context scope is already entered; make a second scope (set_forward_context) to nest"
            )
        self._token = _FORWARD_CONTEXT.set(self.context)
        return self.context

    def __exit__(self, *exc_info: object) -> None:
        token, self._token = self._token, None
        if token is not None:
            _FORWARD_CONTEXT.reset(token)


def set_forward_context(context: ForwardContext) -> ForwardContextScope:
    """Make ``context`` the one ``get_forward_context()`` returns until the block ends (the outer one is restored).

    Example:
        >>> with set_forward_context(ForwardContext(forward_batch="batch")):
        ...     get_forward_context().forward_batch
        'batch'
    """
    return ForwardContextScope(context)


def get_forward_context() -> ForwardContext:
    """The forward context set by the innermost ``set_forward_context``; a ``RuntimeError`` outside one."""
    context = _FORWARD_CONTEXT.get()
    if context is None:
        raise RuntimeError(
            "no forward context is set: an op that reads the batch (such as the attention op) was called outside "
            "`with set_forward_context(ForwardContext(...))`; wrap the forward pass, and every graph replay, in it"
        )
    return context
