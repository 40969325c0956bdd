"""Test doubles of the graph backends, for runner and engine tests on machines without CUDA. Never for production.

``CpuReplayBackend`` implements the part of the backend contract a runner uses (``prepare``, ``capture_session``,
``capture_one``, ``has_shape``, ``replay``, ``runtime_session``, ``cleanup``, ``memory_reading``, ``options``,
``captures_attn_metadata``) on any device, so the runners run exactly the code they run on CUDA:

- ``full``: capture records the forward (a closure over the runner's static buffers); replay runs it again in
  capture mode and copies the result into the output returned at capture, as a graph writes its static output.
- ``breakable``: capture records the forward op by op, as a tape: every torch op between two registered break ops
  is one step of a segment, replayed with the arguments it was captured with (so Python control flow and host-side
  values are frozen at capture, as in a graph segment; a custom op that reads the forward context inside itself, such
  as an engine's KV store, replays under the context of its capture), and every registered break op is an eager call
  run again at replay, reading whatever the forward context holds then; a break op with a ``ReplayBinder`` is bound
  at capture and replays its bound callable instead, exactly as ``BreakableCUDAGraph`` does. A host sync (``.item()``,
  ``.tolist()``) inside a segment is an error, as it is under CUDA stream capture. ``@eager_break`` functions and
  ``add_eager`` calls are not breaks here (only registered operators are), and memory is not pooled.

Device memory is not there on the CPU; ``SimulatedDeviceMemory`` stands in for it where a test needs memory to move
as a GPU's does (a shared pool as large as the largest forward captured into it, a cost per graph, out-of-memory
errors when the total is exceeded), and ``out_of_memory_shapes`` makes chosen shapes fail their capture with an
out-of-memory error, as the real backends report one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from cudagraph.backend_utils import (
    CaptureOptions,
    EagerCall,
    MemoryReading,
    ShapeDescriptor,
    break_options,
    get_forward_context,
    model_capture_mode,
    set_forward_context,
)
from cudagraph.config import Backend

from .base import GraphEntry, release_entries
from .compile_forward import CompileStats
from .entry_inputs import EntryInputs
from .errors import CUDA_GRAPH_CAPTURE_FAILED_HINT, CudaGraphCaptureError

_aten = torch.ops.aten

_ALLOCATIONS = frozenset(
    {
        _aten.empty.memory_format,
        _aten.empty_like.default,
        _aten.empty_strided.default,
        _aten.new_empty.default,
        _aten.new_empty_strided.default,
    }
)
"""Ops a graph does not replay: their memory is fixed at capture, and their contents are whatever is written next."""

_HOST_SYNCS = frozenset({_aten._local_scalar_dense.default, _aten.item.default})


def _tensors(value: Any) -> tuple[torch.Tensor, ...]:
    return tuple(leaf for leaf in tree_flatten(value)[0] if isinstance(leaf, torch.Tensor))


@dataclass
class _TapeStep:
    """One recorded call, replayed like an eager break: called again, its tensor results copied into the ones it
    returned at capture (which later steps read)."""

    call: EagerCall
    eager: bool
    """A registered break op (an eager call of the breakable backend), not an op of a graph segment."""


class CpuTape(TorchDispatchMode):
    """A forward recorded op by op: graph segments (runs of ops) and eager breaks (registered break ops), in order.

    Active as a dispatch mode while recording; a registered break op's insides are not recorded (the op is).
    """

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[_TapeStep] = []
        self._replay_steps: tuple[Callable[[], object], ...] = ()

    @property
    def num_segments(self) -> int:
        """Runs of ops between eager breaks (an empty run, e.g. between two adjacent breaks, is not a segment)."""
        segments, in_segment = 0, False
        for step in self.steps:
            if not step.eager and not in_segment:
                segments += 1
            in_segment = not step.eager
        return segments

    @property
    def num_eager_calls(self) -> int:
        """Eager breaks recorded."""
        return sum(step.eager for step in self.steps)

    def replay(self) -> None:
        """Run every step in capture order."""
        if len(self._replay_steps) != len(self.steps):
            self._replay_steps = tuple(step.call.bind() for step in self.steps)
        for step in self._replay_steps:
            step()

    def reset(self) -> None:
        """Forget everything recorded."""
        self.steps.clear()
        self._replay_steps = ()

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        options = break_options(func)
        if func in _HOST_SYNCS and options is None:
            raise RuntimeError(
                f"{func} reads a device value back to the host inside a graph segment: that is illegal under CUDA "
                f"stream capture, and a graph would replay the capture-time value. Move it into an eager break or "
                f"out of the captured forward"
            )
        result = (options.capture_stub or func)(*args, **kwargs) if options is not None else func(*args, **kwargs)
        if options is not None or func not in _ALLOCATIONS:
            # Inside this handler the tape is off, so what the binder runs is not recorded.
            bound = options.replay_binder(*args, **kwargs) if options is not None and options.replay_binder else None
            fn = func if options is not None else _as_captured(func)
            call = EagerCall(name=str(func), fn=fn, args=args, kwargs=kwargs, copy_back=_tensors(result), bound=bound)
            self.steps.append(_TapeStep(call, eager=options is not None))
        return result


def _as_captured(func: torch._ops.OpOverload) -> Callable[..., Any]:
    """``func`` as a graph segment replays it: a custom op (the engine's KV store) that reads the forward context
    inside itself replays under the context it was captured under, as a graph replays the kernels it launched
    then (aten ops read no context and are returned as they are)."""
    if func.namespace in ("aten", "prims"):
        return func
    try:
        context = get_forward_context()
    except RuntimeError:
        return func

    def under_captured_context(*args: Any, **kwargs: Any) -> Any:
        with set_forward_context(context):
            return func(*args, **kwargs)

    return under_captured_context


@dataclass(frozen=True)
class SimulatedDeviceMemory:
    """Device memory as ``CpuReplayBackend`` reports it, moving as a GPU's does while shapes are captured.

    A forward of a shape has ``activation_bytes_per_row`` per row live at its peak; a pool grows to the largest such
    peak captured into it and keeps it until it is released (cleanup, a renewed pool, the end of a scratch session);
    each graph kept adds ``graph_bytes`` plus ``graph_bytes_per_row`` per row. A warm-up or capture that would need
    more than ``total_bytes`` in all raises ``torch.OutOfMemoryError`` (wrapped as the real backends wrap it).
    """

    total_bytes: int = 8 * 2**30
    activation_bytes_per_row: int = 2**20
    graph_bytes: int = 2**20
    graph_bytes_per_row: int = 0

    def activation(self, shape: int) -> int:
        """Bytes live at the peak of one forward of ``shape`` rows."""
        return self.activation_bytes_per_row * shape

    def graph(self, shape: int) -> int:
        """Bytes one graph of ``shape`` rows keeps beside its pool."""
        return self.graph_bytes + self.graph_bytes_per_row * shape


@dataclass
class _SimulatedPool:
    bytes: int = 0


class CpuReplayBackend:
    """A test double of a graph backend (``full`` or ``breakable``), for any device; see the module docstring.

    It also records what the runner asked of it: ``captured_order``, ``probed`` (shapes captured in scratch
    sessions), ``replayed``, ``prepared``, ``cleaned``.

    Args:
        memory: the device memory it reports and enforces (default: none; every reading is zero).
        out_of_memory_shapes: shapes whose capture fails with an out-of-memory error after its warm-ups (in scratch
            sessions too), leaving nothing of the shape behind.
        graphs_outlive_sleep: what it answers for ``graphs_outlive_sleep`` (a real backend: whether its pool is of
            sleepable memory).
    """

    def __init__(
        self,
        backend: Backend | str = Backend.FULL,
        *,
        options: CaptureOptions | None = None,
        memory: SimulatedDeviceMemory | None = None,
        out_of_memory_shapes: Collection[int] = (),
        graphs_outlive_sleep: bool = False,
    ) -> None:
        self.backend = Backend(backend)
        self.graphs_outlive_sleep = graphs_outlive_sleep
        if self.backend not in (Backend.FULL, Backend.BREAKABLE):
            raise ValueError(f"CpuReplayBackend doubles the full and breakable backends, not {self.backend}")
        self.captures_attn_metadata = self.backend is Backend.FULL
        self.options = options if options is not None else CaptureOptions()
        self.memory = memory
        self.out_of_memory_shapes = frozenset(out_of_memory_shapes)
        self.entries: dict[ShapeDescriptor, GraphEntry] = {}
        """Per-shape state keyed by ``descriptor(shape)``, as a real backend keys it."""
        self.captured_order: list[int] = []
        self.probed: list[int] = []
        self.replayed: list[int] = []
        self.prepared = 0
        self.prepared_forward: Callable[..., Any] | None = None
        self.descriptors: dict[int, ShapeDescriptor] = {}
        self.cleaned = 0
        self.compile_stats: CompileStats | None = None
        """Nothing is compiled here (the contract's attribute, for runners that report compile costs)."""
        self._in_session = False
        self._in_scratch = False
        self._pool = _SimulatedPool()
        self._outer: list[tuple[_SimulatedPool, dict[ShapeDescriptor, GraphEntry]]] = []
        self._peak = 0

    def prepare(self, model_forward: Callable[..., Any] | None, entries: Mapping[int, EntryInputs]) -> None:
        """Count the call and keep the entries' descriptors, as a real backend does (one may compile the model
        here); ``descriptors`` and ``prepared_forward`` hold what it was given."""
        self.prepared += 1
        self.prepared_forward = model_forward
        self.descriptors = {shape: inputs.descriptor for shape, inputs in entries.items()}

    @contextlib.contextmanager
    def capture_session(self, stream: object = None) -> Iterator[None]:
        """Capture mode on for the block, as a real session."""
        self._in_session = True
        try:
            with model_capture_mode():
                yield
        finally:
            self._in_session = False

    @contextlib.contextmanager
    def scratch_session(self) -> Iterator[None]:
        """A capture session into a pool of its own, freed with every shape captured in it when it ends."""
        if self._in_session:
            raise RuntimeError("CpuReplayBackend: a scratch session cannot open inside a capture session")
        self._outer.append((self._pool, self.entries))
        self._pool, self.entries = _SimulatedPool(), {}
        self._in_scratch = True
        try:
            with self.capture_session():
                yield
        finally:
            release_entries(self.entries)
            self._in_scratch = False
            self._pool, self.entries = self._outer.pop()

    def warm_up(self, shape: int, forward_fn: Callable[[], Any]) -> None:
        """Run ``forward_fn`` once, as a warm-up of ``shape`` (inside a capture session), capturing nothing."""
        if not self._in_session:
            raise RuntimeError(f"CpuReplayBackend.warm_up({shape}) must run inside `with capture_session():`")
        self._run_forward(shape)
        forward_fn()

    def capture_one(
        self, shape: int, forward_fn: Callable[[], Any], *, static_inputs: Sequence[torch.Tensor] = ()
    ) -> Any:
        """Warm up, then record ``forward_fn`` as ``shape`` (see the module docstring); return its static output.

        A shape of ``out_of_memory_shapes``, or one the simulated memory cannot hold, fails after its warm-ups with a
        ``CudaGraphCaptureError`` whose cause is ``torch.OutOfMemoryError``, keeping nothing of the shape.
        """
        if not self._in_session:
            raise RuntimeError(f"CpuReplayBackend.capture_one({shape}) must run inside `with capture_session():`")
        self.discard(shape)
        try:
            for _ in range(self.options.num_warmups):
                self._run_forward(shape)
                forward_fn()
            self._claim_capture(shape)
        except torch.OutOfMemoryError as cause:
            raise CudaGraphCaptureError(shape, str(self.backend), cause, CUDA_GRAPH_CAPTURE_FAILED_HINT) from cause
        if self.backend is Backend.FULL:
            output = forward_fn()
            entry = GraphEntry(shape, None, _rerun_into(forward_fn, _tensors(output)), output)
        else:
            tape = CpuTape()
            with tape:
                output = forward_fn()
            entry = GraphEntry(shape, tape, tape.replay, output)
        if self.options.debug:
            entry.input_addresses = tuple(tensor.data_ptr() for tensor in static_inputs)
        self.entries[self.descriptor(shape)] = entry
        (self.probed if self._in_scratch else self.captured_order).append(shape)
        return output

    def _used_bytes(self) -> int:
        memory = self.memory
        if memory is None:
            return 0
        pools = [self._pool, *(pool for pool, _ in self._outer)]
        graphs = self._graph_shapes()
        return sum(pool.bytes for pool in pools) + sum(memory.graph(shape) for shape in graphs)

    def _kept_bytes(self) -> int:
        memory = self.memory
        return sum(memory.graph(shape) for shape in self._graph_shapes()) if memory is not None else 0

    def _graph_shapes(self) -> list[int]:
        """The shape of every graph kept, in this session's entries and the sessions around it."""
        kept = [self.entries, *(entries for _, entries in self._outer)]
        return [entry.shape for entries in kept for entry in entries.values()]

    def _run_forward(self, shape: int) -> None:
        """Account for one eager forward of ``shape`` (its activations live at once, then freed)."""
        memory = self.memory
        if memory is None:
            return
        if self._used_bytes() + memory.activation(shape) > memory.total_bytes:
            raise torch.OutOfMemoryError(f"simulated device memory: a forward of shape {shape} does not fit")
        self._peak = max(self._peak, self._kept_bytes() + memory.activation(shape))

    def _claim_capture(self, shape: int) -> None:
        """Grow the pool to ``shape``'s forward and keep its graph's bytes (or raise out of memory)."""
        if shape in self.out_of_memory_shapes:
            raise torch.OutOfMemoryError(f"out of memory injected while capturing shape {shape}")
        memory = self.memory
        if memory is None:
            return
        growth = max(0, memory.activation(shape) - self._pool.bytes)
        if self._used_bytes() + growth + memory.graph(shape) > memory.total_bytes:
            raise torch.OutOfMemoryError(f"simulated device memory: a graph of shape {shape} does not fit")
        # The captured forward's activations live in the pool (grown to hold them), then its graph is kept.
        self._peak = max(self._peak, self._kept_bytes() + memory.activation(shape))
        self._pool.bytes += growth

    def descriptor(self, shape: int) -> ShapeDescriptor:
        """The descriptor ``prepare`` was given for ``shape``, else one of ``shape`` tokens (the double has no
        phase)."""
        descriptor = self.descriptors.get(shape)
        return descriptor if descriptor is not None else ShapeDescriptor.prefill(shape)

    def entry(self, shape: int) -> GraphEntry:
        """What was captured for ``shape`` (a ``KeyError`` if it was not)."""
        return self.entries[self.descriptor(shape)]

    @property
    def shapes(self) -> tuple[int, ...]:
        """Captured shapes, ascending."""
        return tuple(sorted(entry.shape for entry in self.entries.values()))

    def discard(self, shape: int) -> None:
        """Free the graph of ``shape`` if it was captured (its pool memory stays with the pool)."""
        entry = self.entries.pop(self.descriptor(shape), None)
        if entry is not None:
            entry.release()

    def renew_pool(self) -> None:
        """Release the (simulated) pool while no graph is kept; later captures grow a new one."""
        if self.entries:
            raise RuntimeError(f"CpuReplayBackend.renew_pool(): shapes {list(self.shapes)} still hold graphs")
        self._pool = _SimulatedPool()

    def has_shape(self, shape: int) -> bool:
        """Whether ``shape`` has been captured."""
        return self.descriptor(shape) in self.entries

    def replay(self, shape: int, *, static_inputs: Sequence[torch.Tensor] | None = None) -> Any:
        """Replay ``shape`` (checking static input addresses in debug mode) and return its static output."""
        entry = self.entry(shape)
        if self.options.debug and static_inputs is not None:
            entry.check_input_addresses(static_inputs)
        entry.replay()
        self.replayed.append(shape)
        return entry.output

    def replay_fn(self, shape: int) -> Callable[[], Any]:
        """``replay(shape)`` bound once, as a real backend binds it for a runner's hot path."""
        entry = self.entry(shape)
        replayed = self.replayed

        def replay() -> Any:
            entry.replay()
            replayed.append(shape)
            return entry.output

        return replay

    def runtime_session(self) -> contextlib.AbstractContextManager[None]:
        """Nothing to set around a step."""
        return contextlib.nullcontext()

    def memory_reading(self, *, settle: bool = True, reset_peak: bool = False) -> MemoryReading:
        """The simulated device memory now (all zeros without ``memory``); ``reset_peak`` restarts the peak."""
        memory = self.memory
        if memory is None:
            return MemoryReading(free_bytes=0, reserved_bytes=0, allocated_bytes=0)
        used, kept = self._used_bytes(), self._kept_bytes()
        reading = MemoryReading(
            free_bytes=memory.total_bytes - used,
            reserved_bytes=used,
            allocated_bytes=kept,
            peak_allocated_bytes=max(self._peak, kept),
        )
        if reset_peak:
            self._peak = kept
        return reading

    def cleanup(self) -> None:
        """Forget every shape and release the pool."""
        release_entries(self.entries)
        self._pool = _SimulatedPool()
        self.cleaned += 1


def _rerun_into(forward_fn: Callable[[], Any], static_outputs: tuple[torch.Tensor, ...]) -> Callable[[], None]:
    rerun = EagerCall(name="forward", fn=forward_fn, args=(), kwargs={}, copy_back=static_outputs).bind()

    def replay() -> None:
        with model_capture_mode():
            rerun()

    return replay
