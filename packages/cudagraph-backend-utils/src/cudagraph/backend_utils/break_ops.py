"""The one registry of split operators: where a breakable capture ends a segment and where ``tc_piecewise`` splits
the compiled FX graph, so a model's attention op breaks (and splits) unedited.

``register_split_op`` / ``@split_op`` are the same registry as ``register_break_op``: one list, two names for the
two backends that read it.

A break op may come with a ``ReplayBinder``: called once per break at capture, it returns the zero-argument callable
a breakable replay runs in place of the op (the exact kernel call, with every view and lookup made once), so replay
skips the dispatcher and whatever the op looks up per call. The owner of the op supplies it (the engine for its
attention op); this module only carries it.

A split op may also come with a ``CapturePrefix``: the part of its work a graph can hold (a KV-cache store before
attention, say), which a ``tc_piecewise`` capture runs inside the graph segment before the split call, so that the
eager call at every replay does only the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch

BreakOp = torch._ops.OpOverload | torch._ops.OpOverloadPacket

OpT = TypeVar("OpT")


class ReplayBinder(Protocol):
    """Binds one captured call of a break op for replay: same arguments as the op, returns what replay calls.

    It is called once, at capture, right after the op ran, with the arguments replay will see (the same tensors; CUDA
    ones held without owning their memory). It returns a zero-argument callable that does exactly what the op would
    do with those arguments at replay time, reading the same per-step state (set before each replay), or ``None`` to
    have replay call the op itself. The callable must not keep pool tensors alive beyond the views it takes of the
    arguments it was given.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Callable[[], object] | None:
        """The bound replay call for these arguments, or ``None`` to replay the op."""
        ...


class CapturePrefix(Protocol):
    """Runs, inside the graph segment that ends at a split call, the part of the op's work a graph can hold.

    A ``tc_piecewise`` capture calls it once per split call whose op writes its results in place, while the segment
    before the call is still being captured, with the op's arguments. It launches that part (kernels on those tensors
    only: no host read of device values, no per-step state other than what the tensors hold) and returns the keyword
    arguments that make the op skip it (``{"kv_stored": True}``), or ``None`` when it did nothing. The op is then
    called, captured and replayed with those keywords; the prefix's kernels replay as part of the graph segment.
    Eager forwards and breakable captures never call it.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Mapping[str, Any] | None:
        """Launch the graphable part of the op's work; the keywords that make the op skip it, or ``None``."""
        ...


@dataclass(frozen=True)
class BreakOptions:
    """How one break point runs while capturing."""

    capture_stub: Callable[..., Any] | None = None
    """Called instead of the real function during capture only (same arguments, same outputs, cheaper); the real
    function runs at every replay. Use it when the real one is slow or needs peers (a collective) at capture."""
    replay_binder: ReplayBinder | None = None
    """Binds each captured call for replay (see ``ReplayBinder``); ``None``: replay calls the op."""
    capture_prefix: CapturePrefix | None = None
    """Moves part of the op's work into the graph before it at a ``tc_piecewise`` capture (see ``CapturePrefix``)."""


_BREAK_OVERLOADS: dict[torch._ops.OpOverload, BreakOptions] = {}
_BREAK_PACKETS: dict[torch._ops.OpOverloadPacket, BreakOptions] = {}


def register_break_op(
    op: BreakOp | str,
    *,
    capture_stub: Callable[..., Any] | None = None,
    replay_binder: ReplayBinder | None = None,
    capture_prefix: CapturePrefix | None = None,
) -> None:
    """Make every call of ``op`` inside a breakable capture an eager break (run eagerly at capture and replay).

    ``op`` is an ``OpOverloadPacket`` (all its overloads break, e.g. ``torch.ops.my_lib.attention``) or a single
    ``OpOverload`` (``torch.ops.my_lib.attention.default``). The op must either write its results into tensors the
    caller passes in (and return nothing), or return new tensors, which the capture copies back into buffers the
    following graph segment reads. Registering again replaces the options. ``op`` may also be given by its qualified
    name (``"my_lib::attention"``, ``"my_lib::attention.default"``) or as a ``torch.library.custom_op`` object.

    ``replay_binder`` (see ``ReplayBinder``) lets a breakable replay call a pre-bound callable instead of the op;
    eager calls and compiled graphs always go through the op. ``capture_prefix`` (see ``CapturePrefix``) lets a
    ``tc_piecewise`` capture graph part of the op's work before the split.
    """
    op = _resolve_op(op)
    options = BreakOptions(capture_stub=capture_stub, replay_binder=replay_binder, capture_prefix=capture_prefix)
    if isinstance(op, torch._ops.OpOverloadPacket):
        _BREAK_PACKETS[op] = options
    elif isinstance(op, torch._ops.OpOverload):
        _BREAK_OVERLOADS[op] = options
    else:
        raise TypeError(
            f"register_break_op takes a torch operator (torch.ops.<namespace>.<name>[.<overload>]), "
            f"got {type(op).__name__}: {op!r}; to break on a Python function, decorate it with @eager_break"
        )


def _resolve_op(op: Any) -> Any:
    """``op`` as an ``OpOverload``/``OpOverloadPacket``: qualified names are looked up, custom-op objects unwrapped."""
    if isinstance(op, str):
        namespace, sep, name = op.partition("::")
        if not sep or not namespace or not name:
            raise ValueError(f"a split op's qualified name looks like 'namespace::name[.overload]', got {op!r}")
        name, _, overload = name.partition(".")
        try:
            packet = getattr(getattr(torch.ops, namespace), name)
            return getattr(packet, overload) if overload else packet
        except AttributeError as error:
            raise ValueError(f"no torch operator is registered as {op!r}: define it before registering it") from error
    custom_overload = getattr(op, "_opoverload", None)  # a torch.library.custom_op object
    return custom_overload if isinstance(custom_overload, torch._ops.OpOverload) else op


def unregister_break_op(op: BreakOp | str) -> None:
    """Stop breaking on ``op`` (no error if it was not registered)."""
    op = _resolve_op(op)
    _BREAK_PACKETS.pop(op, None)  # type: ignore[call-overload, arg-type]
    _BREAK_OVERLOADS.pop(op, None)  # type: ignore[call-overload, arg-type]


def break_options(op: BreakOp) -> BreakOptions | None:
    """The options of ``op`` if it (or its packet) is a registered break point, else ``None``.

    A packet (what an FX graph traced by dynamo calls) has its own options if it was registered, else those of the
    first of its overloads that was."""
    if isinstance(op, torch._ops.OpOverloadPacket):
        options = _BREAK_PACKETS.get(op)
        if options is None:
            options = next((found for key, found in _BREAK_OVERLOADS.items() if key.overloadpacket is op), None)
        return options
    options = _BREAK_OVERLOADS.get(op)
    if options is None:
        options = _BREAK_PACKETS.get(op.overloadpacket)
    return options


def registered_break_ops() -> tuple[BreakOp, ...]:
    """Every registered break point, packets first."""
    return (*_BREAK_PACKETS, *_BREAK_OVERLOADS)


def is_split_op(target: object) -> bool:
    """Whether ``target`` (an FX node's target, or any callable) is a registered split op or an overload of one."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return break_options(target) is not None
    return False


register_split_op = register_break_op
"""``tc_piecewise``'s name for ``register_break_op``: the FX graph splits where a breakable capture breaks."""

unregister_split_op = unregister_break_op
"""``tc_piecewise``'s name for ``unregister_break_op``."""

registered_split_ops = registered_break_ops
"""``tc_piecewise``'s name for ``registered_break_ops``."""


def split_op(op: OpT) -> OpT:
    """Decorator form of ``register_split_op``: register ``op`` (a ``torch.library.custom_op`` object, or an operator)
    and return it unchanged.

    Example:
        >>> @split_op
        ... @torch.library.custom_op("doc_example::attend", mutates_args=("out",))
        ... def attend(q: torch.Tensor, out: torch.Tensor) -> None:
        ...     out.copy_(q)
        >>> is_split_op(torch.ops.doc_example.attend.default)
        True
        >>> unregister_split_op(attend)
    """
    register_break_op(op)  # type: ignore[arg-type]
    return op
