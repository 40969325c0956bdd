"""The tc_piecewise backend: ``torch.compile`` traces the model forward once, the FX graph is split at the registered
split ops, each piece is compiled once (``eager`` or ``inductor``), and every captured shape replays as a flat
sequence of graph segments and split-op calls, with no dynamo and no FX at replay.

Workflow:

1. ``prepare(model_forward, entries)`` compiles the forward it is given, ``model_forward(input_ids, positions)``,
   with ``PiecewiseCompiler`` (``piecewise.compiler``) on the largest entry's static inputs (``EntryInputs``), the
   token dimension dynamic, so one compilation serves every entry; each piece and split call in the split module is
   a wrapper (``piecewise.wrappers``).
2. ``capture_one(shape, forward_fn)`` warms up (the compiled forward runs eagerly, piece by piece), then runs
   ``forward_fn`` once more under a capture dispatch for the shape's ``ShapeDescriptor``: the wrappers record a
   ``ShapeSequence`` (``piecewise.sequence``), ending a graph segment at every split call. The code around the model
   forward (the attention-metadata call, the LM head) is captured into the first and last segments.
3. ``replay(shape)`` runs that sequence: a replay launches ``pieces + split calls`` callables and returns the static
   output, like a breakable replay, but the kernels in the segments are the compiled pieces'.

Dynamic shapes: only the token dimension of ``input_ids`` and ``positions`` is marked dynamic (``mark_dynamic``), and
the compile runs with ``backed_size_oblivious`` so that dynamo does not specialize that size on 0 or 1.

Not here: choosing shapes or copying inputs (the runner's job), or reading the forward context (the split ops do).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.fx

from cudagraph.backend_utils import (
    GraphDispatch,
    GraphMode,
    GraphPool,
    ShapeDescriptor,
    enable_tc_piecewise_cuda_graph,
    graph_dispatch,
)
from cudagraph.config import Backend, read_torch_compile_mode

from .base import BackendArgs, BaseCudaGraphBackend, GraphEntry
from .compile_forward import ModelTraceError, compile_model_forward
from .entry_inputs import EntryInputs, entry_to_trace
from .piecewise import (
    BindableOpCall,
    GraphSegments,
    PiecewiseCompiler,
    PiecewiseStats,
    PieceWrapper,
    Recordings,
    SegmentCapture,
    ShapeRecorder,
    ShapeSequence,
    SplitCallWrapper,
    SplitGraph,
    split_at_split_ops,
    split_graph,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger(__name__)

__all__ = [
    "ModelTraceError",
    "PiecewiseCompiler",
    "PiecewiseStats",
    "SplitGraph",
    "TcPiecewiseCudaGraphBackend",
    "split_at_split_ops",
    "split_graph",
]


class TcPiecewiseCudaGraphBackend(BaseCudaGraphBackend):
    """torch.compile splits the model forward at the registered split ops; every shape replays as graph segments (the
    compiled pieces) and split-op calls, in one flat sequence (see the module docstring).

    The attention metadata is computed outside the graphs, before every replay (``captures_attn_metadata = False``),
    as for breakable.

    Args:
        compiler: ``eager`` or ``inductor`` (``--tc-piecewise-compiler``).
        compile_mode: ``torch.compile`` mode of the inductor pieces (``--torch-compile-mode``; ``None``: inductor's
            defaults); see ``InductorPieceCompiler``.
        compile_cache_dir: inductor's cache directory (FX graphs, kernels, autotuning; ``None``:
            ``TORCHINDUCTOR_CACHE_DIR`` or torch's default), reported in the compile summary.
        The other arguments are ``BaseCudaGraphBackend``'s.
    """

    backend: ClassVar[Backend] = Backend.TC_PIECEWISE
    captures_attn_metadata: ClassVar[bool] = False

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        *,
        compiler: str = "eager",
        compile_mode: str | None = None,
        compile_cache_dir: str | os.PathLike[str] | None = None,
        **common: Unpack[BackendArgs],
    ) -> None:
        if compile_mode is not None:  # bad input fails on any machine, before the device check
            read_torch_compile_mode("compile_mode", compile_mode)
        super().__init__(device, **common)
        self.recordings = Recordings()
        """The shapes being captured now (what the wrappers record into)."""
        self.compiler = PiecewiseCompiler(
            compiler,
            wrap_piece=self._wrap_piece,
            wrap_split=self._wrap_split,
            mode=compile_mode,
            cache_dir=compile_cache_dir,
        )
        self.model_forward: Callable[..., Any] | None = None
        """The compiled ``model_forward`` (set by ``prepare``; run at warm-up and capture only)."""
        self.compile_stats: PiecewiseStats = self.compiler.stats
        """Compilations, pieces, split ops, compile seconds, pieces shared and cache use."""

    def _wrap_piece(self, index: int, runnable: Callable[..., Any]) -> Callable[..., Any]:
        return PieceWrapper(index, runnable, self.recordings)

    def _wrap_split(self, index: int, module: torch.fx.GraphModule) -> Callable[..., Any]:
        return SplitCallWrapper(index, module, self.recordings, BindableOpCall.of(module))

    def sequence(self, shape: int) -> ShapeSequence:
        """What a replay of ``shape`` runs (a ``KeyError`` naming the captured shapes if it was not captured)."""
        graph = self.entry(shape).graph
        assert isinstance(graph, ShapeSequence)
        return graph

    def bound_split_calls(self, shape: int) -> int:
        """How many split-op calls of ``shape`` replay their op's pre-bound kernel call (the rest replay the op)."""
        return self.sequence(shape).bound_split_calls if self.has_shape(shape) else 0

    # -- compile ----------------------------------------------------------------------------------------------------

    def prepare(self, model_forward: Callable[..., Any] | None, entries: Mapping[int, EntryInputs]) -> None:
        """The base's, then compile ``model_forward`` once, on the largest entry's static inputs.

        Raises ``ModelTraceError`` (function, line, dynamo's reason) when the forward does not trace whole.
        """
        super().prepare(model_forward, entries)
        if self.model_forward is not None:
            return
        forward, entry = entry_to_trace("tc_piecewise", model_forward, entries)
        with enable_tc_piecewise_cuda_graph():
            compiled = compile_model_forward(
                forward, entry.run_step, entry.token_inputs, self.compiler, self.compile_stats
            )
        self.model_forward = compiled
        logger.info(
            "tc_piecewise (%s, mode %s): %d pieces around %d split ops, %s",
            self.compiler.compiler,
            self.compiler.mode or "default",
            self.compile_stats.pieces,
            self.compile_stats.split_ops,
            self.compile_stats.summary(),
        )

    # -- capture ----------------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def capture_session(self, stream: torch.cuda.Stream | None = None) -> Iterator[None]:
        """The base session, with the compiled forward active (warm-ups run its pieces eagerly)."""
        if self.model_forward is None:
            raise RuntimeError(
                "TcPiecewiseCudaGraphBackend.prepare(model_forward, entries) must run before capture_session()"
            )
        with super().capture_session(stream), enable_tc_piecewise_cuda_graph(self.model_forward):
            yield

    def _segment_capture(self, pool: GraphPool) -> SegmentCapture:
        """How segments are recorded: CUDA graphs in ``pool``."""
        return GraphSegments(pool, self.options.capture_error_mode)

    def _capture(
        self, shape: int, forward_fn: Callable[[], Any], stream: torch.cuda.Stream, pool: GraphPool
    ) -> GraphEntry:
        descriptor = self.descriptor(shape)
        capture = self._segment_capture(pool)
        sequence, output = record_shape(
            descriptor, forward_fn, capture, self.recordings, debug=self.options.debug, stream=stream
        )
        if not whole_passes(sequence.pieces, self.compile_stats.pieces):
            sequence.reset()
            raise RuntimeError(
                f"tc_piecewise: capturing {descriptor} ran {sequence.pieces} compiled piece(s), the compiled forward "
                f"has {self.compile_stats.pieces}: the forward did not go whole through the compiled model forward "
                f"(call compiled_model_forward() in place of the eager one, once per forward of the step)"
            )
        return GraphEntry(shape=shape, graph=sequence, replay=sequence.replay, output=output)


def whole_passes(pieces_run: int, pieces: int) -> bool:
    """Whether a capture that ran ``pieces_run`` compiled pieces went whole through a forward of ``pieces`` pieces
    one or more times (a step of chained forwards, such as draft steps, passes through it once per forward).

    Example:
        >>> whole_passes(6, 3), whole_passes(3, 3), whole_passes(4, 3), whole_passes(0, 3)
        (True, True, False, False)
    """
    return pieces_run > 0 and pieces_run % max(pieces, 1) == 0


def record_shape(
    descriptor: ShapeDescriptor,
    forward_fn: Callable[[], Any],
    capture: SegmentCapture,
    recordings: Recordings,
    *,
    debug: bool = False,
    stream: torch.cuda.Stream | None = None,
) -> tuple[ShapeSequence, Any]:
    """Run ``forward_fn`` under a capture dispatch for ``descriptor`` and return the recorded sequence and output.

    The wrappers of the compiled forward record into ``recordings`` (see ``piecewise.sequence``); ``stream`` (CUDA)
    is the stream the segments are captured on. On failure everything recorded is freed and the error propagates.
    """
    recorder = ShapeRecorder(descriptor, capture, debug=debug)
    recordings.active[descriptor] = recorder
    on_stream = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
    try:
        with on_stream, graph_dispatch(GraphDispatch(GraphMode.CAPTURE, descriptor)):
            recorder.start()
            try:
                output = forward_fn()
                sequence = recorder.finish()
            except BaseException:
                recorder.abort()
                raise
    finally:
        del recordings.active[descriptor]
    return sequence, output
