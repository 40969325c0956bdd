"""One captured shape as a flat sequence: graph launches and bound split-op calls, replayed in order.

Workflow of a capture (``ShapeRecorder``, driven by the wrappers of the compiled forward):

1. ``start()`` begins the first segment on the capture stream.
2. Each piece wrapper runs its compiled piece inside the open segment (``piece``); on a machine without CUDA the
   ``EagerSegments`` stand-in records the call instead, so the same sequence runs its pieces eagerly.
3. Each split wrapper ends the segment (``split``): an op with a ``CapturePrefix`` that writes in place first runs
   that part of its work (a KV store) inside the segment; the segment becomes one launch, and is replayed at once so
   the split op sees real values, as it will at every replay; the split op (told by the prefix's keywords to skip
   what the segment did) runs eagerly and is recorded as an ``EagerCall``: its op's bound kernel call where the op
   has a ``ReplayBinder`` and writes in place, else a call of its submodule whose new results are copied into the
   tensors it returned at capture, which the next piece reads. The next segment begins.
4. ``finish()`` ends the last segment and returns the ``ShapeSequence``.

Code around the compiled forward that runs in the same capture (the step's attention-metadata call, the LM head)
lands in the first and last segments, so a replay is ``segments + split calls`` launches and nothing else: no dynamo
guard, no FX interpretation, no wrapper call. Not here: what a piece or split is (``wrappers``), the pool
(``cudagraph.backend_utils.GraphPool``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from cudagraph.backend_utils import (
    CapturePrefix,
    EagerCall,
    GraphPool,
    ReplayBinder,
    ShapeDescriptor,
    graph_replay_fn,
)

__all__ = ["EagerSegments", "GraphSegments", "SegmentCapture", "ShapeRecorder", "ShapeSequence", "SplitOpCall"]

Step = Callable[[], object]


class SegmentCapture(Protocol):
    """How the work between two split calls is recorded and replayed."""

    def begin(self) -> None:
        """Start recording a segment."""
        ...

    def end(self, reason: str) -> Step | None:
        """Stop recording; the segment's replay (after running it once), or ``None`` when it recorded no work."""
        ...

    def note_call(self, name: str, runnable: Callable[..., Any], args: tuple[Any, ...], output: Any) -> None:
        """``runnable(*args)`` (a piece, or a split op's prefix) ran inside the open segment and returned ``output``."""
        ...

    def abort(self) -> None:
        """Free the open segment and every segment recorded so far."""
        ...

    def reset(self) -> None:
        """Free every recorded segment (after the sequence is dropped)."""
        ...


@dataclass
class GraphSegments:
    """Segments as CUDA graphs in ``pool``, captured on the current stream (``SegmentCapture`` on CUDA)."""

    pool: GraphPool
    capture_error_mode: str = "global"
    graphs: list[torch.cuda.CUDAGraph] = field(default_factory=list)
    current: torch.cuda.CUDAGraph | None = None

    def begin(self) -> None:
        """Start recording a segment."""
        self.current = self.pool.begin_capture(self.capture_error_mode)

    def end(self, reason: str) -> Step | None:
        """Stop recording; the segment's replay (after running it once), or ``None`` for an empty one."""
        graph, self.current = self.current, None
        if graph is None:
            return None
        try:
            recorded = self.pool.end_capture(graph)
        except Exception as error:
            number = len(self.graphs)
            raise RuntimeError(f"tc_piecewise: graph segment #{number} could not end at {reason}: {error}") from error
        if not recorded:
            return None
        self.graphs.append(graph)
        graph.replay()  # capturing computes nothing: run it so the split op that follows sees real values
        return graph_replay_fn(graph)

    def note_call(self, name: str, runnable: Callable[..., Any], args: tuple[Any, ...], output: Any) -> None:
        """A call ran inside the open segment."""
        return None  # its kernels are in the open graph

    def abort(self) -> None:
        """Free the open segment and every recorded one."""
        if self.current is not None:
            self.pool.abort_capture(self.current)
            self.current = None
        self.reset()

    def reset(self) -> None:
        """Free every recorded segment."""
        for graph in self.graphs:
            graph.reset()
        self.graphs.clear()


@dataclass
class EagerSegments:
    """Segments as recorded piece calls, replayed eagerly (``SegmentCapture`` on any device, for CPU tests).

    Each piece (and split-op prefix) is recorded as an ``EagerCall``: it reruns on the arguments it was captured with
    and its results are copied into the tensors it returned at capture, as a graph writes the memory it was captured
    writing. Code between pieces (outside the compiled forward) is not recorded.
    """

    current: list[Step] | None = None

    def begin(self) -> None:
        """Start recording a segment."""
        self.current = []

    def end(self, reason: str) -> Step | None:
        """Stop recording; the segment's replay (after running it once), or ``None`` for an empty one."""
        steps, self.current = self.current, None
        if not steps:
            return None
        if len(steps) == 1:
            return steps[0]
        return functools.partial(_run_all, tuple(steps))

    def note_call(self, name: str, runnable: Callable[..., Any], args: tuple[Any, ...], output: Any) -> None:
        """A call ran inside the open segment: recorded, to rerun at replay."""
        if self.current is not None:
            self.current.append(EagerCall.record(name, runnable, args, {}, output).bind())

    def abort(self) -> None:
        """Free the open segment and every recorded one."""
        self.current = None

    def reset(self) -> None:
        """Nothing to free: the recorded calls go with the sequence."""


def _run_all(steps: tuple[Step, ...]) -> None:
    for step in steps:
        step()


@dataclass(frozen=True)
class SplitOpCall:
    """The op call a split submodule makes, as the recorder needs it: the op, its arguments, and what the op
    registered for captures (``cudagraph.backend_utils.register_split_op``)."""

    op: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    binder: ReplayBinder | None
    """Binds the call for replay (``None``: replay calls the op)."""
    prefix: CapturePrefix | None
    """Graphs part of the op's work before the split (``None``: the op does all of it eagerly)."""


@dataclass
class ShapeSequence:
    """What one captured shape replays: ``steps`` in order (segment launches and split calls), nothing else."""

    shape: ShapeDescriptor
    steps: tuple[Step, ...]
    segments: int
    """Graph launches a replay makes."""
    split_calls: tuple[EagerCall, ...]
    """The split-op calls between them, as recorded."""
    pieces: int
    """Compiled pieces that ran inside the segments at capture."""
    capture: SegmentCapture
    debug: bool = False
    prefixes: int = 0
    """Split calls whose op's capture prefix runs inside the segment before them."""

    @property
    def launches(self) -> int:
        """Callables a replay runs: one per segment and one per split call."""
        return len(self.steps)

    @property
    def bound_split_calls(self) -> int:
        """Split calls that replay their op's pre-bound kernel call (the rest replay the op or its submodule)."""
        return sum(call.bound is not None for call in self.split_calls)

    def replay(self) -> None:
        """Run every step in capture order on the current stream."""
        if self.debug:
            for index, call in enumerate(self.split_calls):
                call.check_addresses(index)
        for step in self.steps:
            step()

    def reset(self) -> None:
        """Free the segments; the sequence must not be replayed afterwards."""
        self.steps = ()
        self.split_calls = ()
        self.capture.reset()


@dataclass
class ShapeRecorder:
    """The capture of one shape in progress (see the module docstring)."""

    shape: ShapeDescriptor
    capture: SegmentCapture
    debug: bool = False
    steps: list[Step] = field(default_factory=list)
    split_calls: list[EagerCall] = field(default_factory=list)
    pieces: int = 0
    segments: int = 0
    prefixes: int = 0

    def start(self) -> None:
        """Begin the first segment."""
        self.capture.begin()

    def piece(self, runnable: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """Run a compiled piece inside the open segment."""
        output = runnable(*args)
        self.capture.note_call("tc_piecewise piece", runnable, args, output)
        self.pieces += 1
        return output

    def split(
        self,
        name: str,
        module: Callable[..., Any],
        args: tuple[Any, ...],
        op_call: Callable[[tuple[Any, ...]], SplitOpCall] | None = None,
    ) -> Any:
        """End the segment, run the split call ``module(*args)`` eagerly and record it, begin the next segment.

        ``op_call(args)`` gives the op call the submodule makes, for a split whose op has a ``ReplayBinder`` or a
        ``CapturePrefix``: the prefix runs inside the segment before it ends and the op (with the prefix's keywords)
        stands for the submodule; if the op wrote its results in place, the replay runs the binder's callable.
        """
        call_of_op = op_call(args) if op_call is not None and not self.debug else None
        skip = self._run_prefix(name, call_of_op) if call_of_op is not None else None
        self._end_segment(f"split call {name}")
        if call_of_op is not None and skip is not None:
            kwargs = {**call_of_op.kwargs, **skip}
            output = call_of_op.op(*call_of_op.args, **kwargs)
            call = EagerCall.record(name, call_of_op.op, call_of_op.args, kwargs, None, replay_binder=call_of_op.binder)
        else:
            output = module(*args)
            call = EagerCall.record(name, module, args, {}, output, debug=self.debug)
            if call_of_op is not None and call_of_op.binder is not None and not call.copy_back:
                bound_call = EagerCall.record(
                    name, call_of_op.op, call_of_op.args, call_of_op.kwargs, None, replay_binder=call_of_op.binder
                )
                if bound_call.bound is not None:
                    call = bound_call
        self.split_calls.append(call)
        self.steps.append(call.bind())
        self.capture.begin()
        return () if skip is not None else output

    def _run_prefix(self, name: str, call_of_op: SplitOpCall) -> dict[str, Any] | None:
        """Run the op's capture prefix inside the open segment; the keywords that make the op skip it, or ``None``."""
        if call_of_op.prefix is None:
            return None
        skip = call_of_op.prefix(*call_of_op.args, **call_of_op.kwargs)
        if skip is None:
            return None
        prefix = functools.partial(call_of_op.prefix, **call_of_op.kwargs)
        self.capture.note_call(f"{name} prefix", prefix, call_of_op.args, None)
        self.prefixes += 1
        return dict(skip)

    def _end_segment(self, reason: str) -> None:
        step = self.capture.end(reason)
        if step is not None:
            self.steps.append(step)
            self.segments += 1

    def finish(self) -> ShapeSequence:
        """End the last segment and return what a replay of this shape runs."""
        self._end_segment("the end of capture")
        return ShapeSequence(
            self.shape,
            tuple(self.steps),
            self.segments,
            tuple(self.split_calls),
            self.pieces,
            self.capture,
            self.debug,
            self.prefixes,
        )

    def abort(self) -> None:
        """Free everything recorded after a failure."""
        self.capture.abort()
        self.steps.clear()
        self.split_calls.clear()
