"""Breakable capture: record a forward pass as graph segments with eager calls between them, replay them in order.

A break ends the current segment (``capture_end``), runs the eager function once on the capture stream, records it,
and begins the next segment on the same pool (``capture_begin(pool=...)``), so intermediates flow between segments
through pool memory exactly as inside one graph. Breaks come from ``add_eager(fn, *args)``, from functions decorated
with ``@eager_break``, and from calls of torch operators registered with ``register_break_op`` (seen through a
``TorchDispatchMode`` active only while capturing, so the model itself is not edited).

Each segment is replayed right after it is captured, so the capture pass computes real values and an eager function
sees the data it will see at replay. Replay is one loop over callables bound at the end of capture: each segment's
``CUDAGraph`` replay, and for each break either the recorded call or, when the break op has a ``ReplayBinder``, the
callable that binder returned at capture (the kernel call itself, with no dispatcher and no per-call lookups).

Constraints, and why:

- An eager function must read and write memory the graph segments know: its tensor arguments are replayed as the
  same tensors (same addresses), and its results either go into a caller-provided output argument (it returns
  nothing), or it returns tensors, which are copied back at every replay into the buffers the capture returned.
- Tensor arguments on CUDA are kept without owning their memory (like the addresses a graph kernel reads): keep
  tensors created before the capture (inputs, caches, weights) alive as long as the graph.
- Side streams forked inside a segment must be joined back (``capture_stream.wait_stream(side)``) before a break or
  the end of capture; a segment cannot span an eager call.
- One capture per thread; nesting is an error.
- Python values an eager function returns are the capture-time values; only tensors are refreshed at replay.

Debug mode (``CaptureOptions(debug=True)``, or the environment variable ``CUDAGRAPH_BREAKABLE_DEBUG=1`` read once at
import) records the ops of each segment for error messages and the addresses of every eager argument at capture, and
checks them before each replay; it adds detail and checks, never changes results.

Example (on a CUDA machine)::

    static_x = torch.zeros(8, device="cuda")
    graph = BreakableCUDAGraph()
    with graph.capture():
        y = static_x * 2
        add_eager(torch.Tensor.add_, y, 1)  # runs eagerly, in place
        out = y.sin()
    static_x.copy_(torch.randn(8, device="cuda"))
    graph.replay()  # out now holds sin(static_x * 2 + 1)
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map_only

from .break_ops import ReplayBinder, break_options
from .capture_options import CaptureOptions
from .capture_state import breakable_cuda_graph_active
from .errors import BreakableCaptureError, require_cuda
from .graph_pool import GraphPool, GraphPoolHandle, get_global_graph_memory_pool
from .memory import weak_ref_tensor
from .replay import graph_replay_fn

F = TypeVar("F", bound=Callable[..., Any])

_ACTIVE_CAPTURE: ContextVar[_CaptureRecorder | None] = ContextVar("cudagraph_breakable_capture", default=None)


# --------------------------------------------------------------------------------------------------------------------
# What a capture records
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class EagerCall:
    """One eager break as recorded: the function, its arguments, and the buffers its results are copied into."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    copy_back: tuple[torch.Tensor, ...]
    """Static buffers (the capture-time results) that replay refreshes; empty when ``fn`` writes into its args."""
    argument_addresses: tuple[tuple[int, torch.Tensor, int], ...] = ()
    """Debug only: (argument index, the caller's tensor, its data pointer at capture)."""
    bound: Callable[[], object] | None = None
    """What the op's ``ReplayBinder`` returned at capture: run at replay instead of ``fn(*args, **kwargs)``."""

    @classmethod
    def record(
        cls,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        result: Any,
        *,
        replay_binder: ReplayBinder | None = None,
        debug: bool = False,
    ) -> EagerCall:
        """The record of ``fn(*args, **kwargs)``, which has just run and returned ``result``, for replay.

        CUDA tensor arguments are kept without owning their memory (like the addresses a graph kernel reads), so pool
        intermediates can be reused by the next capture. Results that are not arguments are refreshed at replay by
        copying into ``result``'s tensors; results written in place need nothing. ``replay_binder`` (the op's, see
        ``ReplayBinder``) is called now, with those same arguments; ``debug`` records argument addresses.
        """
        argument_tensors = [leaf for leaf in tree_flatten((args, kwargs))[0] if isinstance(leaf, torch.Tensor)]
        argument_addresses = {tensor.data_ptr() for tensor in argument_tensors}
        result_tensors = [leaf for leaf in tree_flatten(result)[0] if isinstance(leaf, torch.Tensor)]
        # A result that is one of the arguments was written in place; anything else is refreshed by copying back.
        needs_copy = any(tensor.data_ptr() not in argument_addresses for tensor in result_tensors)
        recorded_addresses: tuple[tuple[int, torch.Tensor, int], ...] = ()
        if debug:
            recorded_addresses = tuple(
                (index, tensor, tensor.data_ptr()) for index, tensor in enumerate(argument_tensors)
            )
        replay_args, replay_kwargs = tree_map_only(torch.Tensor, _replay_reference, (args, kwargs))
        # Bound from the replay references, so the callable pins no pool memory the next capture may reuse.
        bound = replay_binder(*replay_args, **replay_kwargs) if replay_binder is not None else None
        return cls(
            name=name,
            fn=fn,
            args=replay_args,
            kwargs=replay_kwargs,
            copy_back=tuple(result_tensors) if needs_copy else (),
            argument_addresses=recorded_addresses,
            bound=bound,
        )

    def bind(self) -> Callable[[], object]:
        """The zero-argument callable replay runs for this call."""
        if self.bound is not None:
            if not self.copy_back:
                return self.bound
            return functools.partial(_call_and_copy_back, self.bound, (), {}, self.copy_back)
        if not self.copy_back:
            return cast(Callable[[], None], functools.partial(self.fn, *self.args, **self.kwargs))
        return functools.partial(_call_and_copy_back, self.fn, self.args, self.kwargs, self.copy_back)

    def check_addresses(self, call_index: int) -> None:
        """Raise if a tensor argument recorded in debug mode has moved since capture (``call_index`` names the call
        in the message)."""
        for arg_index, tensor, address in self.argument_addresses:
            if tensor.data_ptr() != address:
                raise BreakableCaptureError(
                    f"eager call #{call_index} ({self.name}): argument {arg_index} was at {address:#x} at capture "
                    f"but is at {tensor.data_ptr():#x} now; the graph segments still use the old memory, so "
                    f"replay would read stale data. Keep static tensors in place (copy into them, never rebind "
                    f"or resize them) or capture again"
                )

    def rerun(self, *args: Any, **kwargs: Any) -> None:
        """Run ``fn`` on this step's arguments (not the recorded ones) and refresh ``copy_back`` from its results:
        for a caller whose arguments are the same tensors at every step but may carry other values (host tensors,
        Python numbers) that must not be frozen at capture."""
        if not self.copy_back:
            self.fn(*args, **kwargs)
            return
        _call_and_copy_back(self.fn, args, kwargs, self.copy_back)


def _call_and_copy_back(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], static_outputs: tuple[torch.Tensor, ...]
) -> None:
    fresh_outputs = [leaf for leaf in tree_flatten(fn(*args, **kwargs))[0] if isinstance(leaf, torch.Tensor)]
    for static, fresh in zip(static_outputs, fresh_outputs, strict=True):
        if static.data_ptr() != fresh.data_ptr():
            static.copy_(fresh)


@dataclass
class _Segment:
    graph: torch.cuda.CUDAGraph
    ops: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------------------------------
# The replayable object
# --------------------------------------------------------------------------------------------------------------------


class BreakableCUDAGraph:
    """A forward pass captured as ordered graph segments and eager calls; ``replay()`` runs them in order.

    Args:
        pool: the pool to allocate from (share one across captures so they reuse memory): a ``GraphPool``, whose
            owner releases it, or a bare handle, which this graph holds until ``reset()``; default: the global
            pool's handle if one is set, else a new pool of this graph's own (read it back from ``.pool`` to share
            it).
        options: the capture switches this primitive reads: ``debug`` (segment ops and eager argument addresses,
            checked before each replay), ``split_every_op``, ``barrier`` and ``capture_error_mode``.
    """

    __slots__ = ("_eager_calls", "_makes_own_pools", "_releases_pool", "_segments", "_steps", "options", "pool")

    def __init__(
        self, *, pool: GraphPool | GraphPoolHandle | None = None, options: CaptureOptions | None = None
    ) -> None:
        require_cuda()
        if pool is None:
            pool = get_global_graph_memory_pool()
        # A pool object belongs to whoever passed it; a handle (or a pool made here) is this graph's to release.
        self._releases_pool = not isinstance(pool, GraphPool)
        self._makes_own_pools = pool is None
        self.pool: GraphPool = GraphPool.create() if pool is None else GraphPool.of(pool)
        self.options = options if options is not None else CaptureOptions()
        self._segments: tuple[_Segment, ...] = ()
        self._eager_calls: tuple[EagerCall, ...] = ()
        self._steps: tuple[Callable[[], object], ...] = ()

    @property
    def num_segments(self) -> int:
        """Graph segments recorded (empty segments, e.g. between two adjacent breaks, are not kept)."""
        return len(self._segments)

    @property
    def num_eager_calls(self) -> int:
        """Eager breaks recorded."""
        return len(self._eager_calls)

    @property
    def eager_calls(self) -> tuple[EagerCall, ...]:
        """The recorded eager breaks, in order."""
        return self._eager_calls

    @property
    def captured(self) -> bool:
        """Whether a capture has completed (and ``reset`` not been called since)."""
        return bool(self._steps)

    @contextlib.contextmanager
    def capture(self, stream: torch.cuda.Stream | None = None) -> Iterator[BreakableCUDAGraph]:
        """Record the block on ``stream`` (default: one side stream per device, shared by every capture, since
        pool blocks are reused only by captures on the stream that allocated them) as segments and eager calls.

        The capture stream first waits for the current stream (so inputs written there are visible) and the current
        stream waits for the capture at the end. On any failure everything recorded so far is freed and the error
        propagates; the graph is then empty and can capture again.
        """
        if _ACTIVE_CAPTURE.get() is not None:
            raise BreakableCaptureError(
                "a breakable capture is already recording in this thread; nested captures are not supported: "
                "end the outer capture first, or call the inner code directly so the outer capture records it"
            )
        if torch.cuda.is_current_stream_capturing():
            raise BreakableCaptureError(
                "the current stream is already being captured into a CUDA graph; a breakable capture cannot start "
                "inside another graph capture"
            )
        if self._steps:
            raise BreakableCaptureError("this BreakableCUDAGraph already holds a capture; call reset() first")
        capture_stream = stream if stream is not None else default_capture_stream()
        # Keeps the pool valid while segments are dropped or a failed capture is freed.
        self.pool.hold(capture_stream)
        capture_stream.wait_stream(torch.cuda.current_stream())
        recorder = _CaptureRecorder(self, capture_stream)
        token = _ACTIVE_CAPTURE.set(recorder)
        try:
            with torch.cuda.stream(capture_stream), breakable_cuda_graph_active(), _BreakDispatchMode(recorder):
                recorder.begin_segment()
                yield self
                recorder.end_segment(reason="the end of capture")
        except BaseException:
            recorder.abort()
            if self._makes_own_pools:
                # A failed capture may leave torch routing to this pool (see GraphPool.end_capture): retry in a
                # fresh one.
                self.pool.release()
                self.pool.renew()
            raise
        finally:
            _ACTIVE_CAPTURE.reset(token)
        torch.cuda.current_stream().wait_stream(capture_stream)
        self._segments = tuple(recorder.segments)
        self._eager_calls = tuple(step for step in recorder.steps if isinstance(step, EagerCall))
        self._steps = tuple(
            graph_replay_fn(step.graph) if isinstance(step, _Segment) else step.bind() for step in recorder.steps
        )

    def replay(self) -> None:
        """Run every segment and eager call in capture order on the current stream."""
        if self.options.debug:
            self.check_addresses()
        for step in self._steps:
            step()

    def check_addresses(self) -> None:
        """Raise if a tensor an eager call was captured with has moved since (debug mode records them)."""
        for call_index, call in enumerate(self._eager_calls):
            call.check_addresses(call_index)

    def reset(self) -> None:
        """Free every segment, eager call and copy-back buffer; the object can capture again.

        A pool this graph made itself is released and replaced by a new one. A handle passed in is released once no
        graph uses it (capturing into that handle again then needs ``torch.cuda.empty_cache()`` first); a
        ``GraphPool`` passed in is left to its owner.
        """
        for segment in self._segments:
            segment.graph.reset()
        self._segments = ()
        self._eager_calls = ()
        self._steps = ()
        if self._releases_pool:
            self.pool.release()
            if self._makes_own_pools:
                self.pool.renew()

    def __repr__(self) -> str:
        return f"BreakableCUDAGraph(segments={self.num_segments}, eager_calls={self.num_eager_calls})"


@contextlib.contextmanager
def breakable_capture(
    graph: BreakableCUDAGraph | None = None,
    *,
    stream: torch.cuda.Stream | None = None,
    pool: GraphPool | GraphPoolHandle | None = None,
    options: CaptureOptions | None = None,
) -> Iterator[BreakableCUDAGraph]:
    """Capture the block into ``graph`` (a new ``BreakableCUDAGraph(pool=pool, options=options)`` by default) and
    yield it."""
    if graph is None:
        graph = BreakableCUDAGraph(pool=pool, options=options)
    elif pool is not None or options is not None:
        raise TypeError("pass pool and options to BreakableCUDAGraph, not with an existing graph")
    with graph.capture(stream):
        yield graph


# --------------------------------------------------------------------------------------------------------------------
# Capture-time machinery
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class _CaptureRecorder:
    """The state of one capture in progress (one per thread, reachable through ``_ACTIVE_CAPTURE``)."""

    graph: BreakableCUDAGraph
    stream: torch.cuda.Stream
    steps: list[_Segment | EagerCall] = field(default_factory=list)
    current: torch.cuda.CUDAGraph | None = None
    current_ops: list[str] = field(default_factory=list)
    side_streams: dict[int, torch.cuda.Stream] = field(default_factory=dict)
    running_eager: bool = False

    @property
    def segments(self) -> list[_Segment]:
        return [step for step in self.steps if isinstance(step, _Segment)]

    def begin_segment(self) -> None:
        self.current = self.graph.pool.begin_capture(self.graph.options.capture_error_mode)
        self.current_ops = []
        self.side_streams = {}

    def end_segment(self, reason: str) -> None:
        """End the current segment (if recording), keep it if it recorded work, and run it once."""
        segment, self.current = self.current, None
        if segment is None:
            return
        try:
            recorded = self.graph.pool.end_capture(segment)
        except Exception as error:
            raise self._segment_error(reason, error) from error
        if recorded:
            self.steps.append(_Segment(segment, tuple(self.current_ops)))
            # Execute what was just recorded, so the eager call that follows sees real data.
            segment.replay()

    def _segment_error(self, reason: str, error: Exception) -> Exception:
        number = len(self.segments)
        ops = f" after ops {', '.join(self.current_ops[-8:])}" if self.current_ops else ""
        if self.side_streams:
            names = ", ".join(repr(stream) for stream in self.side_streams.values())
            return BreakableCaptureError(
                f"graph segment #{number} could not end at {reason}{ops}: side stream(s) {names} forked inside it "
                f"were not joined back. Make the capture stream wait for each side stream "
                f"(torch.cuda.current_stream().wait_stream(side)) before a break or the end of capture "
                f"(CUDA said: {error})"
            )
        return BreakableCaptureError(f"graph segment #{number} could not end at {reason}{ops}: {error}")

    def note_op(self, op_name: str) -> None:
        """Remember which side streams (and, in debug mode, which ops) the current segment used."""
        stream = torch.cuda.current_stream()
        if stream.cuda_stream != self.stream.cuda_stream:
            self.side_streams.setdefault(stream.cuda_stream, stream)
        if self.graph.options.debug:
            self.current_ops.append(op_name)

    def split(self, reason: str) -> None:
        """End the current segment and begin the next, with no eager work between them."""
        if torch.cuda.current_stream().cuda_stream != self.stream.cuda_stream:
            raise BreakableCaptureError(
                f"a segment boundary ({reason}) was reached on stream {torch.cuda.current_stream()!r}, not on the "
                f"capture stream {self.stream!r}: breaks must happen on the capture stream"
            )
        self.end_segment(reason)
        self.begin_segment()

    def eager_break(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        capture_stub: Callable[..., Any] | None,
        name: str,
        replay_binder: ReplayBinder | None = None,
    ) -> Any:
        """End the segment, run ``fn`` (or its stub) eagerly once, record it for replay (bound by ``replay_binder``
        when given), begin the next segment."""
        reason = f"the eager break {name}"
        if torch.cuda.current_stream().cuda_stream != self.stream.cuda_stream:
            raise BreakableCaptureError(
                f"{reason} was called on stream {torch.cuda.current_stream()!r}, not on the capture stream "
                f"{self.stream!r}: call eager breaks on the capture stream (join side streams first)"
            )
        self.end_segment(reason)
        if self.graph.options.barrier is not None:
            self.graph.options.barrier()
        self.running_eager = True
        try:
            result = (capture_stub or fn)(*args, **kwargs)
        finally:
            self.running_eager = False
        self.steps.append(
            EagerCall.record(
                name, fn, args, kwargs, result, replay_binder=replay_binder, debug=self.graph.options.debug
            )
        )
        self.begin_segment()
        return result

    def abort(self) -> None:
        """Free everything recorded after a failure: the segment in progress and every finished one."""
        if self.current is not None:
            with torch.cuda.stream(self.stream):
                self.graph.pool.abort_capture(self.current)
            self.current = None
        for segment in self.segments:
            segment.graph.reset()
        self.steps.clear()


_DEFAULT_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def default_capture_stream() -> torch.cuda.Stream:
    """The side stream breakable captures use on the current device unless given one (made once, then reused)."""
    device = torch.cuda.current_device()
    stream = _DEFAULT_CAPTURE_STREAMS.get(device)
    if stream is None:
        stream = _DEFAULT_CAPTURE_STREAMS[device] = torch.cuda.Stream(device)
    return stream


def _replay_reference(tensor: torch.Tensor) -> torch.Tensor:
    # CUDA memory is held like a graph kernel holds it (by address), so pool intermediates can be reused by the next
    # capture; host tensors are kept alive, since nothing else guarantees that a host tensor made during the forward
    # outlives the capture.
    return weak_ref_tensor(tensor) if tensor.is_cuda else tensor


class _BreakDispatchMode(TorchDispatchMode):
    """Sees every op while capturing: registered break ops become eager breaks; others are noted (and split)."""

    def __init__(self, recorder: _CaptureRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's ``__torch_dispatch__`` in ``torch._disable_dynamo`` unless this says no: that wrapper
        # imports dynamo on the first op of the first capture in a process (about a second) and costs a frame on
        # every op after. Nothing compiles inside a breakable capture, so there is nothing for it to guard.
        return False

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        recorder = self.recorder
        if recorder.running_eager or recorder.current is None:
            return func(*args, **kwargs)
        options = break_options(func)
        if options is not None:
            return recorder.eager_break(
                func, args, kwargs, options.capture_stub, name=str(func), replay_binder=options.replay_binder
            )
        recorder.note_op(str(func))
        result = func(*args, **kwargs)
        if recorder.graph.options.split_every_op:
            recorder.split(f"the op {func} (split_every_op)")
        return result


# --------------------------------------------------------------------------------------------------------------------
# Break points
# --------------------------------------------------------------------------------------------------------------------


def _active_recorder() -> _CaptureRecorder | None:
    recorder = _ACTIVE_CAPTURE.get()
    if recorder is None or recorder.running_eager:
        return None
    return recorder


def add_eager(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn(*args, **kwargs)``; inside a breakable capture, as an eager break that replay runs again.

    Outside a capture (and inside another eager call) this is a plain call. ``fn`` may be an ``@eager_break``
    function, whose ``capture_stub`` is then used at capture. Returns ``fn``'s result (at capture: tensors the next
    segments may read, refreshed at every replay).
    """
    recorder = _active_recorder()
    if recorder is None:
        return fn(*args, **kwargs)
    stub = fn.capture_stub if isinstance(fn, EagerBreakFunction) else None
    real = fn.fn if isinstance(fn, EagerBreakFunction) else fn
    return recorder.eager_break(real, args, kwargs, stub, name=_callable_name(real))


def force_split() -> None:
    """End the current graph segment and begin the next, with no eager work (no-op outside a breakable capture)."""
    recorder = _active_recorder()
    if recorder is not None:
        recorder.split("force_split()")


class EagerBreakFunction:
    """A function made an eager break by ``@eager_break``: a plain call outside a capture."""

    __slots__ = ("__dict__", "capture_stub", "fn")

    def __init__(self, fn: Callable[..., Any], capture_stub: Callable[..., Any] | None = None) -> None:
        self.fn = fn
        self.capture_stub = capture_stub
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function; inside a breakable capture, as an eager break."""
        recorder = _active_recorder()
        if recorder is None:
            return self.fn(*args, **kwargs)
        return recorder.eager_break(self.fn, args, kwargs, self.capture_stub, name=_callable_name(self.fn))

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        # Decorating a method: bind like a function would.
        return self if instance is None else functools.partial(self, instance)


def eager_break(fn: F | None = None, *, capture_stub: Callable[..., Any] | None = None) -> F | Callable[[F], F]:
    """Decorator: every call of the function inside a breakable capture is an eager break.

    ``capture_stub`` (same signature, same outputs, cheaper) runs instead of the function while capturing only.
    Put ``@eager_break`` outermost: decorators above it run only at capture, never at replay.

    Example:
        >>> @eager_break
        ... def scale_(x, factor):
        ...     x.mul_(factor)
        >>> import torch
        >>> t = torch.ones(2)
        >>> scale_(t, 3.0)  # outside a capture: a plain call
        >>> t.tolist()
        [3.0, 3.0]
    """

    def wrap(function: F) -> F:
        return cast(F, EagerBreakFunction(function, capture_stub))

    return wrap if fn is None else wrap(fn)


def _callable_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
