"""The registry of torch operators that break a breakable capture, so a model's attention op breaks unedited."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

BreakOp = torch._ops.OpOverload | torch._ops.OpOverloadPacket


@dataclass(frozen=True)
class BreakOptions:
    """How one break point runs while capturing."""

    capture_stub: Callable[..., Any] | None = None
    """Called instead of the real function during capture only (same arguments, same outputs, cheaper); the real
    function runs at every replay. Use it when the real one is slow or needs peers (a collective) at capture."""


_BREAK_OVERLOADS: dict[torch._ops.OpOverload, BreakOptions] = {}
_BREAK_PACKETS: dict[torch._ops.OpOverloadPacket, BreakOptions] = {}


def register_break_op(op: BreakOp, *, capture_stub: Callable[..., Any] | None = None) -> None:
    """Make every call of ``op`` inside a breakable capture an eager break (run eagerly at capture and replay).

    ``op`` is an ``OpOverloadPacket`` (all its overloads break, e.g. ``torch.ops.my_lib.attention``) or a single
    ``OpOverload`` (``torch.ops.my_lib.attention.default``). The op must either write its results into tensors the
    caller passes in (and return nothing), or return new tensors, which the capture copies back into buffers the
    following graph segment reads. Registering again replaces the options.
    """
    options = BreakOptions(capture_stub=capture_stub)
    if isinstance(op, torch._ops.OpOverloadPacket):
        _BREAK_PACKETS[op] = options
    elif isinstance(op, torch._ops.OpOverload):
        _BREAK_OVERLOADS[op] = options
    else:
        raise TypeError(
            f"register_break_op takes a torch operator (torch.ops.<namespace>.<name>[.<overload>]), "
            f"got {type(op).__name__}: {op!r}; to break on a Python function, decorate it with @eager_break"
        )


def unregister_break_op(op: BreakOp) -> None:
    """Stop breaking on ``op`` (no error if it was not registered)."""
    _BREAK_PACKETS.pop(op, None)  # type: ignore[call-overload, arg-type]
    _BREAK_OVERLOADS.pop(op, None)  # type: ignore[call-overload, arg-type]


def break_options(op: torch._ops.OpOverload) -> BreakOptions | None:
    """The options of ``op`` if it (or its packet) is a registered break point, else ``None``."""
    options = _BREAK_OVERLOADS.get(op)
    if options is None:
        options = _BREAK_PACKETS.get(op.overloadpacket)
    return options


def registered_break_ops() -> tuple[BreakOp, ...]:
    """Every registered break point, packets first."""
    return (*_BREAK_PACKETS, *_BREAK_OVERLOADS)
