"""Test doubles of the graph backends, for runner and engine tests on machines without CUDA. Never for production.

``CpuReplayBackend`` implements the part of the backend contract a runner uses (``prepare``, ``capture_session``,
``capture_one``, ``has_shape``, ``replay``, ``runtime_session``, ``cleanup``, ``memory_reading``, ``options``,
``captures_attn_metadata``) on any device, so the runners run exactly the code they run on CUDA:

- ``full``: capture records the forward (a closure over the runner's static buffers); replay runs it again in
  capture mode and copies the result into the output returned at capture, as a graph writes its static output.
- ``breakable``: capture records the forward op by op, as a tape: every torch op between two registered break ops
  is one step of a segment, replayed with the arguments it was captured with (so Python control flow and host-side
  values are frozen at capture, as in a graph segment), and every registered break op is an eager call run again at
  replay, reading whatever the forward context holds then; a break op with a ``ReplayBinder`` is bound at capture
  and replays its bound callable instead, exactly as ``BreakableCUDAGraph`` does. A host sync (``.item()``,
  ``.tolist()``) inside a segment is an error, as it is under CUDA stream capture. ``@eager_break`` functions and
  ``add_eager`` calls are not breaks here (only registered operators are), and memory is not pooled.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from cudagraph.backend_utils import CaptureOptions, EagerCall, MemoryReading, break_options, model_capture_mode
from cudagraph.config import Backend

from .base import GraphEntry
from .compile_forward import CompileStats

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
            call = EagerCall(name=str(func), fn=func, args=args, kwargs=kwargs, copy_back=_tensors(result), bound=bound)
            self.steps.append(_TapeStep(call, eager=options is not None))
        return result


class CpuReplayBackend:
    """A test double of a graph backend (``full`` or ``breakable``), for any device; see the module docstring.

    It also records what the runner asked of it: ``captured_order``, ``replayed``, ``prepared``, ``cleaned``.
    """

    def __init__(self, backend: Backend | str = Backend.FULL, *, options: CaptureOptions | None = None) -> None:
        self.backend = Backend(backend)
        if self.backend not in (Backend.FULL, Backend.BREAKABLE):
            raise ValueError(f"CpuReplayBackend doubles the full and breakable backends, not {self.backend}")
        self.captures_attn_metadata = self.backend is Backend.FULL
        self.options = options if options is not None else CaptureOptions()
        self.entries: dict[int, GraphEntry] = {}
        self.captured_order: list[int] = []
        self.replayed: list[int] = []
        self.prepared = 0
        self.cleaned = 0
        self.compile_stats: CompileStats | None = None
        """Nothing is compiled here (the contract's attribute, for runners that report compile costs)."""
        self._in_session = False

    def prepare(self, runner: object) -> None:
        """Count the call (a real backend may compile the model here)."""
        self.prepared += 1

    @contextlib.contextmanager
    def capture_session(self, stream: object = None) -> Iterator[None]:
        """Capture mode on for the block, as a real session."""
        self._in_session = True
        try:
            with model_capture_mode():
                yield
        finally:
            self._in_session = False

    def capture_one(
        self, shape: int, forward_fn: Callable[[], Any], *, static_inputs: Sequence[torch.Tensor] = ()
    ) -> Any:
        """Warm up, then record ``forward_fn`` as ``shape`` (see the module docstring); return its static output."""
        if not self._in_session:
            raise RuntimeError(f"CpuReplayBackend.capture_one({shape}) must run inside `with capture_session():`")
        for _ in range(self.options.num_warmups):
            forward_fn()
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
        self.entries[shape] = entry
        self.captured_order.append(shape)
        return output

    def has_shape(self, shape: int) -> bool:
        """Whether ``shape`` has been captured."""
        return shape in self.entries

    def replay(self, shape: int, *, static_inputs: Sequence[torch.Tensor] | None = None) -> Any:
        """Replay ``shape`` (checking static input addresses in debug mode) and return its static output."""
        entry = self.entries[shape]
        if self.options.debug and static_inputs is not None:
            entry.check_input_addresses(static_inputs)
        entry.replay()
        self.replayed.append(shape)
        return entry.output

    def replay_fn(self, shape: int) -> Callable[[], Any]:
        """``replay(shape)`` bound once, as a real backend binds it for a runner's hot path."""
        entry = self.entries[shape]
        replayed = self.replayed

        def replay() -> Any:
            entry.replay()
            replayed.append(shape)
            return entry.output

        return replay

    def runtime_session(self) -> contextlib.AbstractContextManager[None]:
        """Nothing to set around a step."""
        return contextlib.nullcontext()

    def memory_reading(self, *, settle: bool = True) -> MemoryReading:
        """No device memory is tracked: all zeros."""
        return MemoryReading(free_bytes=0, reserved_bytes=0, allocated_bytes=0)

    def cleanup(self) -> None:
        """Forget every shape."""
        for entry in self.entries.values():
            entry.release()
        self.entries.clear()
        self.cleaned += 1


def _rerun_into(forward_fn: Callable[[], Any], static_outputs: tuple[torch.Tensor, ...]) -> Callable[[], None]:
    rerun = EagerCall(name="forward", fn=forward_fn, args=(), kwargs={}, copy_back=static_outputs).bind()

    def replay() -> None:
        with model_capture_mode():
            rerun()

    return replay
