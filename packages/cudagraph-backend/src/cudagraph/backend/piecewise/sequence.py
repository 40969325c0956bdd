"""One captured shape as a flat sequence: graph launches and bound split-op calls, replayed in order.

Workflow of a capture (``ShapeRecorder``, driven by the wrappers of the compiled forward):

1. ``start()`` begins the first segment on the capture stream.
2. Each piece wrapper runs its compiled piece inside the open segment (``piece``); on a machine without CUDA the
   ``EagerSegments`` stand-in records the call instead, so the same sequence runs its pieces eagerly.
3. Each split wrapper ends the segment (``split``): the segment becomes one launch, and is replayed at once so the
   split op sees real values, as it will at every replay; the split op runs eagerly and is recorded as an
   ``EagerCall``: its op's bound kernel call where the op has a ``ReplayBinder`` and writes in place, else a call of
   its submodule whose new results are copied into the tensors it returned at capture, which the next piece reads.
   The next segment begins.
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

from cudagraph.backend_utils import EagerCall, GraphPool, ReplayBinder, ShapeDescriptor, graph_replay_fn

__all__ = ["EagerSegments", "GraphSegments", "SegmentCapture", "ShapeRecorder", "ShapeSequence"]

Step = Callable[[], object]


class SegmentCapture(Protocol):
    """How the work between two split calls is recorded and replayed."""

    def begin(self) -> None:
        """Start recording a segment."""
        ...

    def end(self, reason: str) -> Step | None:
        """Stop recording; the segment's replay (after running it once), or ``None`` when it recorded no work."""
        ...

    def note_piece(self, runnable: Callable[..., Any], args: tuple[Any, ...], output: Any) -> None:
        """A piece ran inside the open segment with ``args`` and returned ``output``."""
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

    def note_piece(self, runnable: Callable[..., Any], args: tuple[Any, ...], output: Any) -> None:
        """A piece ran inside the open segment."""
        return None  # the piece's kernels are in the open graph

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

    Each piece is recorded as an ``EagerCall``: it reruns on the arguments it was captured with and its results are
    copied into the tensors it returned at capture, as a graph writes the memory it was captured writing. Code between
    pieces (outside the compiled forward) is not recorded.
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

    def note_piece(self, runnable: Callable[..., Any], args: tuple[Any, ...], output: Any) -> None:
        """A piece ran inside the open segment."""
        if self.current is not None:
            self.current.append(EagerCall.record("tc_piecewise piece", runnable, args, {}, output).bind())

    def abort(self) -> None:
        """Free the open segment and every recorded one."""
        self.current = None

    def reset(self) -> None:
        """Nothing to free: the recorded calls go with the sequence."""


def _run_all(steps: tuple[Step, ...]) -> None:
    for step in steps:
        step()


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

    def start(self) -> None:
        """Begin the first segment."""
        self.capture.begin()

    def piece(self, runnable: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """Run a compiled piece inside the open segment."""
        output = runnable(*args)
        self.capture.note_piece(runnable, args, output)
        self.pieces += 1
        return output

    def split(
        self,
        name: str,
        module: Callable[..., Any],
        args: tuple[Any, ...],
        op_call: Callable[[tuple[Any, ...]], tuple[Any, tuple[Any, ...], dict[str, Any], ReplayBinder]] | None = None,
    ) -> Any:
        """End the segment, run the split call ``module(*args)`` eagerly and record it, begin the next segment.

        ``op_call(args)`` gives ``(op, op_args, op_kwargs, binder)`` for a split whose op has a ``ReplayBinder``: if
        the op wrote its results in place, the replay runs the binder's callable instead of the submodule.
        """
        self._end_segment(f"split call {name}")
        output = module(*args)
        call = EagerCall.record(name, module, args, {}, output, debug=self.debug)
        if op_call is not None and not call.copy_back and not self.debug:
            op, op_args, op_kwargs, binder = op_call(args)
            bound_call = EagerCall.record(name, op, op_args, op_kwargs, None, replay_binder=binder)
            if bound_call.bound is not None:
                call = bound_call
        self.split_calls.append(call)
        self.steps.append(call.bind())
        self.capture.begin()
        return output

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
        )

    def abort(self) -> None:
        """Free everything recorded after a failure."""
        self.capture.abort()
        self.steps.clear()
        self.split_calls.clear()
