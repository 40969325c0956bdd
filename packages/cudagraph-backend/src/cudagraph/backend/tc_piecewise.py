"""The tc_piecewise backend: ``torch.compile`` traces the model forward once, the FX graph is split at the registered
split ops, each piece between two split ops is compiled (``eager`` or ``inductor``) and captured as a CUDA graph per
shape into the one pool, and the split ops (attention) run eagerly between the pieces, at capture and at replay.

Three layers, each usable alone:

- ``split_at_split_ops(graph_module)``: ``torch.fx.passes.split_module`` cut at every call of a registered split op
  (the registry ``breakable`` breaks at: ``register_split_op`` is ``register_break_op``). Pure FX, any device.
- ``PiecewiseCompiler``: the callable given to ``torch.compile(backend=...)``. It splits the graph, compiles every
  piece with the configured compiler, and hands each compiled piece to ``wrap_piece`` (identity by default, so on a
  machine without CUDA the split forward runs eagerly piece by piece: that is what the CPU tests check). It counts
  compilations, so a recompile is visible in its stats.
- ``TcPiecewiseCudaGraphBackend``: the ``BaseCudaGraphBackend`` that compiles the host model runner's
  ``model_forward(input_ids, positions)`` in ``prepare()`` and wraps each piece so that, per shape, it is captured in
  ``capture_one()`` and replayed by ``replay()``. It also wraps each split-op call: recorded per shape at capture,
  and replayed like a breakable break (the op's ``ReplayBinder`` call where it has one, so the engine's attention
  replays as its bare kernel calls; results not written in place copied back into the tensors the next piece reads).

Dynamic shapes: only the token dimension of ``input_ids`` and ``positions`` is marked dynamic (``mark_dynamic``), and
the compile runs with ``backed_size_oblivious`` so that dynamo does not specialize that size on 0 or 1: one graph then
serves every bucket, batch 1 included. ``dynamic=True`` would also make every other dimension symbolic and still
specialize size 1, which costs a second compilation for decode's smallest bucket.

Never here: choosing shapes or copying inputs (the runner's job), or reading the forward context (the split ops do).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

from cudagraph.backend_utils import (
    CaptureOptions,
    EagerCall,
    GraphPool,
    ReplayBinder,
    break_options,
    enable_tc_piecewise_cuda_graph,
    graph_replay_fn,
    is_split_op,
    model_capture_mode,
    weak_ref_tensors,
)
from cudagraph.config import TC_PIECEWISE_COMPILERS, Backend, ConfigError, Phase, read_torch_compile_mode

from .base import BaseCudaGraphBackend, GraphEntry
from .compile_forward import CompileStats, ModelTraceError, compile_model_forward, inductor_mode_options

logger = logging.getLogger(__name__)

__all__ = [
    "ModelTraceError",
    "PiecewiseCompiler",
    "PiecewiseStats",
    "SplitGraph",
    "TcPiecewiseCudaGraphBackend",
    "split_at_split_ops",
]


# --------------------------------------------------------------------------------------------------------------------
# Splitting
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitGraph:
    """A graph module cut at its split ops: ``module`` calls ``submod_<i>`` in order; ``piece_names`` are the
    submodules between split ops (compiled and graphed), ``split_names`` the ones holding one split-op call each."""

    module: torch.fx.GraphModule
    piece_names: tuple[str, ...]
    split_names: tuple[str, ...]


def split_at_split_ops(graph_module: torch.fx.GraphModule) -> SplitGraph:
    """Cut ``graph_module`` before and after every call of a registered split op.

    Partitions are numbered in node order, a split op taking a partition of its own, so a graph with ``n`` split
    ops (none adjacent, none first or last) has ``n + 1`` pieces. The original node order is kept, so ops with side
    effects and no users (a KV-cache store) stay before the split op that reads what they wrote.
    """
    partition_of: dict[torch.fx.Node, int] = {}
    split_partitions: set[int] = set()
    partition = 0
    for node in graph_module.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "call_function" and is_split_op(node.target):
            partition += 1
            partition_of[node] = partition
            split_partitions.add(partition)
            partition += 1
        else:
            partition_of[node] = partition
    split = split_module(graph_module, graph_module, lambda node: partition_of[node], keep_original_order=True)
    names = sorted(
        (name for name, _ in split.named_children() if name.startswith("submod_")),
        key=lambda name: int(name.removeprefix("submod_")),
    )
    pieces = tuple(name for name in names if int(name.removeprefix("submod_")) not in split_partitions)
    splits = tuple(name for name in names if int(name.removeprefix("submod_")) in split_partitions)
    return SplitGraph(split, pieces, splits)


# --------------------------------------------------------------------------------------------------------------------
# Compiling
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class PiecewiseStats(CompileStats):
    """``CompileStats`` plus the shape of the latest split."""

    pieces: int = 0
    """Compiled pieces of the latest graph (split ops + 1 for a model whose first and last ops are not splits)."""
    split_ops: int = 0
    """Split-op calls of the latest graph (eager between pieces)."""


PieceWrapper = Callable[[int, Callable[..., Any]], Callable[..., Any]]
"""``wrap_piece(index, compiled_piece) -> callable``: what runs in the split graph in place of piece ``index``."""

SplitWrapper = Callable[[int, torch.fx.GraphModule], Callable[..., Any]]
"""``wrap_split(index, split_submodule) -> callable``: what runs in the split graph in place of split-op call
``index`` (a submodule holding that one call)."""


class PiecewiseCompiler:
    """A ``torch.compile`` backend: split at the registered split ops, compile each piece, wrap each piece.

    Args:
        compiler: ``eager`` runs each piece's ``GraphModule`` as traced; ``inductor`` compiles each piece with
            ``torch._inductor.compile_fx.compile_fx`` on the symbolic example inputs of that piece (``compile_fx`` and
            not ``compile_fx_inner``: the pieces come straight from dynamo, not yet functionalized, and ``compile_fx``
            runs AOTAutograd first; and not ``torch.compile`` of each piece, which would trace again and guard
            each piece on its own shapes).
        wrap_piece: called once per compiled piece; the backend puts its per-shape CUDA-graph wrapper here.
        wrap_split: called once per split-op submodule; the backend records and binds each call per shape here
            (identity by default).
        mode: ``torch.compile`` mode of the inductor pieces, one of ``cudagraph.config.TORCH_COMPILE_MODES``
            (``--torch-compile-mode``; ``None``: inductor's defaults): its inductor config patches go to
            ``compile_fx``. Unused by ``eager``.

    Example:
        >>> compiler = PiecewiseCompiler("eager")
        >>> compiled = torch.compile(lambda x: x.sin() + 1, backend=compiler, fullgraph=True)
        >>> bool(torch.allclose(compiled(torch.ones(3)), torch.ones(3).sin() + 1)), compiler.stats.pieces
        (True, 1)
    """

    def __init__(
        self,
        compiler: str = "eager",
        *,
        wrap_piece: PieceWrapper | None = None,
        wrap_split: SplitWrapper | None = None,
        mode: str | None = None,
    ) -> None:
        if compiler not in TC_PIECEWISE_COMPILERS:
            raise ConfigError(
                f"unknown tc_piecewise compiler {compiler!r}; allowed: {', '.join(TC_PIECEWISE_COMPILERS)}"
            )
        if mode is not None:
            read_torch_compile_mode("tc_piecewise compile mode", mode)
        self.compiler = compiler
        self.mode = mode
        self.wrap_piece: PieceWrapper = wrap_piece if wrap_piece is not None else (lambda index, piece: piece)
        self.wrap_split: SplitWrapper = wrap_split if wrap_split is not None else (lambda index, split: split)
        self.stats = PiecewiseStats()
        self.split: SplitGraph | None = None
        """The latest split graph (for inspection and tests)."""

    def __call__(self, graph_module: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        """Compile one dynamo graph: split, compile the pieces, return the split module (called like the graph)."""
        split = split_at_split_ops(graph_module)
        compiled = self._compile_pieces(split, example_inputs)
        for index, name in enumerate(split.piece_names):
            # An instance attribute shadows the submodule: the split graph's `self.submod_<i>(...)` then calls the
            # wrapper directly, with no nn.Module call overhead per piece and step.
            split.module.__dict__[name] = self.wrap_piece(index, compiled[name])
        for index, name in enumerate(split.split_names):
            split.module.__dict__[name] = self.wrap_split(index, getattr(split.module, name))
        self.split = split
        self.stats.compilations += 1
        self.stats.pieces = len(split.piece_names)
        self.stats.split_ops = len(split.split_names)
        return split.module

    def _compile_pieces(self, split: SplitGraph, example_inputs: Sequence[Any]) -> dict[str, Callable[..., Any]]:
        pieces = {name: getattr(split.module, name) for name in split.piece_names}
        if self.compiler == "eager":
            return pieces
        return _compile_with_inductor(split, example_inputs, pieces, inductor_mode_options(self.mode))


class _PieceInputRecorder(torch.fx.Interpreter):
    """Runs the split graph on dynamo's fake example values and records the arguments each piece receives."""

    def __init__(self, module: torch.fx.GraphModule, piece_names: Sequence[str]) -> None:
        super().__init__(module)
        self.piece_names = frozenset(piece_names)
        self.inputs: dict[str, tuple[Any, ...]] = {}

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        if target in self.piece_names:
            self.inputs[target] = tuple(args)
        return super().call_module(target, args, kwargs)


def _compile_with_inductor(
    split: SplitGraph,
    example_inputs: Sequence[Any],
    pieces: dict[str, Callable[..., Any]],
    config_patches: dict[str, Any],
) -> dict[str, Callable[..., Any]]:
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import detect_fake_mode
    from torch._inductor.compile_fx import compile_fx

    # Dynamo's own fake mode: the fake inputs then carry the graph's symbolic token size, which every piece shares.
    fake_mode = detect_fake_mode(example_inputs)
    if fake_mode is None:
        raise RuntimeError("tc_piecewise with inductor must be called by torch.compile (no fake mode is active)")
    fake_inputs = [
        fake_mode.from_tensor(value) if isinstance(value, torch.Tensor) else value for value in example_inputs
    ]
    recorder = _PieceInputRecorder(split.module, split.piece_names)
    with fake_mode, enable_python_dispatcher():
        recorder.run(*fake_inputs)
    compiled: dict[str, Callable[..., Any]] = {}
    for name, piece in pieces.items():
        assert isinstance(piece, torch.fx.GraphModule)
        compiled[name] = cast(
            Callable[..., Any], compile_fx(piece, list(recorder.inputs[name]), config_patches=config_patches)
        )
    return compiled


# --------------------------------------------------------------------------------------------------------------------
# The backend
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class _PieceEntry:
    """One piece's capture of one shape."""

    graph: torch.cuda.CUDAGraph | None
    output: Any
    input_addresses: tuple[int, ...] = ()
    launch: Callable[[], None] | None = None
    """The graph's replay, bound once (``graph_replay_fn``); ``None`` for a piece that captured no graph."""


def _tensor_addresses(args: Sequence[Any]) -> tuple[int, ...]:
    return tuple(arg.data_ptr() for arg in args if isinstance(arg, torch.Tensor))


@dataclass
class _PieceGraphs:
    """A compiled piece with its CUDA graph per shape: eager when no capture or replay is on, captured into the
    backend's pool in capture mode, replayed in replay mode."""

    index: int
    runnable: Callable[..., Any]
    owner: TcPiecewiseCudaGraphBackend
    entries: dict[int, _PieceEntry] = field(default_factory=dict)

    def __call__(self, *args: Any) -> Any:
        owner = self.owner
        mode = owner._piece_mode
        if mode is None:
            return self.runnable(*args)
        shape = owner._piece_shape
        if mode == "capture":
            return self._capture(shape, args)
        entry = self.entries.get(shape)
        if entry is None:
            # A graph compiled after capture (a recompile) has no graphs: run it eagerly, count it.
            owner.compile_stats.uncaptured_replays += 1
            return self.runnable(*args)
        if owner.options.debug:
            addresses = _tensor_addresses(args)
            if addresses != entry.input_addresses:
                raise RuntimeError(
                    f"tc_piecewise piece {self.index}, shape {shape}: its inputs are not where they were at capture; "
                    f"the graph would read stale memory (copy new values into the captured buffers instead)"
                )
        if entry.launch is not None:
            entry.launch()
        return entry.output

    def _capture(self, shape: int, args: tuple[Any, ...]) -> Any:
        owner = self.owner
        pool, stream = owner._capture_target()
        graph, output = pool.capture(
            lambda: self.runnable(*args), stream=stream, capture_error_mode=owner.options.capture_error_mode
        )
        if graph is not None:
            # Capturing computes nothing: replay once so the split op after this piece sees real values, as it
            # will at every replay (the same order of work as the breakable capture).
            with torch.cuda.stream(stream):
                graph.replay()
        # Held weakly: the pool may hand this memory to another shape once this shape's capture is done. The strong
        # output is returned, so the later pieces of this capture cannot be given the same memory.
        entry = _PieceEntry(
            graph, weak_ref_tensors(output), launch=graph_replay_fn(graph) if graph is not None else None
        )
        if owner.options.debug:
            entry.input_addresses = _tensor_addresses(args)
        self.entries[shape] = entry
        return output

    def discard(self, shape: int) -> None:
        entry = self.entries.pop(shape, None)
        if entry is not None and entry.graph is not None:
            entry.graph.reset()


@dataclass(frozen=True)
class _BindableOpCall:
    """The one split-op call of a split submodule whose op has a ``ReplayBinder``: which submodule arguments it
    takes, so the call can be bound at capture like a breakable break."""

    op: Any
    binder: ReplayBinder
    node: torch.fx.Node
    placeholders: tuple[torch.fx.Node, ...]

    @classmethod
    def of(cls, module: torch.fx.GraphModule) -> _BindableOpCall | None:
        """The call, if ``module`` is exactly one call of a split op with a replay binder (else ``None``)."""
        placeholders: list[torch.fx.Node] = []
        calls: list[torch.fx.Node] = []
        for node in module.graph.nodes:
            if node.op == "placeholder":
                placeholders.append(node)
            elif node.op == "call_function":
                calls.append(node)
            elif node.op != "output":
                return None
        if len(calls) != 1:
            return None
        options = break_options(calls[0].target)  # type: ignore[arg-type]
        if options is None or options.replay_binder is None:
            return None
        return cls(calls[0].target, options.replay_binder, calls[0], tuple(placeholders))

    def arguments(self, module_args: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The op's arguments when the submodule is called with ``module_args``."""
        values = dict(zip(self.placeholders, module_args, strict=True))
        args = torch.fx.node.map_arg(self.node.args, values.__getitem__)
        kwargs = torch.fx.node.map_arg(self.node.kwargs, values.__getitem__)
        return tuple(args), dict(kwargs)


@dataclass(frozen=True)
class _SplitEntry:
    """One split-op call's record for one shape."""

    call: EagerCall
    """The call as captured: the op with its pre-bound kernel call (``call.bound``), or the submodule with the
    tensors its results refresh (``call.copy_back``)."""
    output: Any
    """What the call returned at capture (the next piece's graph reads these tensors), returned at every replay."""

    def replay(self, args: tuple[Any, ...]) -> Any:
        """Run the call for this step and return the capture-time output, refreshed."""
        if self.call.bound is not None:
            self.call.bound()
        else:
            self.call.rerun(*args)
        return self.output


@dataclass
class _SplitCall:
    """A split-op submodule between two pieces, run eagerly: as is outside graphs; at capture, run and recorded per
    shape; at replay, run again for the step. An in-place op with a ``ReplayBinder`` (the engine's attention) replays
    the callable its binder returned at capture (the kernel call itself: no dispatcher, no forward-context lookup, no
    views made per call), as a breakable replay does. Any other split op replays through the submodule with the
    step's arguments, and results it returns (not written in place) are copied into the tensors it returned at
    capture, which the next piece's graph was captured reading."""

    index: int
    module: torch.fx.GraphModule
    owner: TcPiecewiseCudaGraphBackend
    bindable: _BindableOpCall | None
    entries: dict[int, _SplitEntry] = field(default_factory=dict)

    def __call__(self, *args: Any) -> Any:
        owner = self.owner
        mode = owner._piece_mode
        if mode is None:
            return self.module(*args)
        shape = owner._piece_shape
        if mode == "capture":
            return self._capture(shape, args)
        entry = self.entries.get(shape)
        if entry is None:
            return self.module(*args)
        return entry.replay(args)

    def _capture(self, shape: int, args: tuple[Any, ...]) -> Any:
        output = self.module(*args)
        name = f"tc_piecewise split {self.index}"
        call = EagerCall.record(name, self.module, args, {}, output)
        # An op that writes in place (nothing to copy back) and has a binder replays as its bound kernel call.
        if self.bindable is not None and not call.copy_back and not self.owner.options.debug:
            op_args, op_kwargs = self.bindable.arguments(args)
            op_call = EagerCall.record(
                name, self.bindable.op, op_args, op_kwargs, None, replay_binder=self.bindable.binder
            )
            if op_call.bound is not None:
                call = op_call
        self.entries[shape] = _SplitEntry(call, output)
        return output

    def is_bound(self, shape: int) -> bool:
        """Whether ``shape``'s replay calls the op's pre-bound kernel call."""
        entry = self.entries.get(shape)
        return entry is not None and entry.call.bound is not None

    def discard(self, shape: int) -> None:
        self.entries.pop(shape, None)


@dataclass
class _ShapeGraphs:
    """What ``GraphEntry.graph`` holds for tc_piecewise: one shape's graphs across every piece (``reset`` frees)."""

    backend: TcPiecewiseCudaGraphBackend
    shape: int

    def reset(self) -> None:
        for piece in self.backend._pieces:
            piece.discard(self.shape)
        for split in self.backend._splits:
            split.discard(self.shape)


class TcPiecewiseCudaGraphBackend(BaseCudaGraphBackend):
    """torch.compile splits the model forward at the registered split ops; every piece is a CUDA graph per shape.

    ``prepare(runner)`` compiles the host model runner's ``model_forward(input_ids, positions)`` once (dynamic token
    dimension, ``fullgraph=True``) by running the largest bucket's static batch under the compile-warm-up flag.
    ``capture_one(shape, forward_fn)`` warms up, then runs ``forward_fn`` with every piece capturing its graph for
    ``shape`` into the one pool; the split ops run eagerly. ``replay(shape)`` runs ``forward_fn`` again: the pieces
    replay their graphs, the split ops run eagerly, and the code around the model forward (attention metadata, the
    LM head) runs eagerly, so the result is a new tensor each step, not a static one. The attention metadata is
    therefore computed outside the graphs (``captures_attn_metadata = False``).

    Args:
        compiler: ``eager`` or ``inductor`` (``--tc-piecewise-compiler``).
        compile_mode: ``torch.compile`` mode of the inductor pieces (``--torch-compile-mode``; ``None``: inductor's
            defaults); see ``PiecewiseCompiler``.
        The other arguments are ``BaseCudaGraphBackend``'s.
    """

    backend: ClassVar[Backend] = Backend.TC_PIECEWISE
    captures_attn_metadata: ClassVar[bool] = False

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        *,
        phase: Phase | str | None = None,
        options: CaptureOptions | None = None,
        pool: GraphPool | None = None,
        share_global_pool: bool = True,
        compiler: str = "eager",
        compile_mode: str | None = None,
    ) -> None:
        if compile_mode is not None:  # bad input fails on any machine, before the device check
            read_torch_compile_mode("compile_mode", compile_mode)
        super().__init__(device, phase=phase, options=options, pool=pool, share_global_pool=share_global_pool)
        self.compiler = PiecewiseCompiler(
            compiler, wrap_piece=self._wrap_piece, wrap_split=self._wrap_split, mode=compile_mode
        )
        self.model_forward: Callable[..., Any] | None = None
        """The compiled ``model_forward`` (set by ``prepare``)."""
        self._pieces: list[_PieceGraphs] = []
        self._splits: list[_SplitCall] = []
        self._piece_mode: str | None = None
        self._piece_shape = 0
        self._recompiles_reported = 0
        self.compile_stats: PiecewiseStats = self.compiler.stats
        """Compilations, pieces, split ops, compile seconds, cache use and replays that found no graph."""

    def _wrap_piece(self, index: int, runnable: Callable[..., Any]) -> Callable[..., Any]:
        if index == 0:
            self._pieces = []  # a new compilation: its pieces replace the old ones
        piece = _PieceGraphs(index, runnable, self)
        self._pieces.append(piece)
        return piece

    def _wrap_split(self, index: int, module: torch.fx.GraphModule) -> Callable[..., Any]:
        if index == 0:
            self._splits = []  # a new compilation: its split calls replace the old ones
        split = _SplitCall(index, module, self, _BindableOpCall.of(module))
        self._splits.append(split)
        return split

    def bound_split_calls(self, shape: int) -> int:
        """How many split-op calls of ``shape`` replay their op's pre-bound kernel call (the rest replay the op)."""
        return sum(split.is_bound(shape) for split in self._splits)

    def _capture_target(self) -> tuple[GraphPool, torch.cuda.Stream]:
        stream = self._session_stream
        if stream is None:
            raise RuntimeError("tc_piecewise: a piece was captured outside a capture session")
        return self.ensure_pool(), stream

    # -- compile ----------------------------------------------------------------------------------------------------

    def prepare(self, runner: object) -> None:
        """Compile the host model runner's ``model_forward`` once, on the largest bucket's static batch.

        Raises ``ModelTraceError`` (function, line, dynamo's reason) when the forward does not trace whole.
        """
        if self.model_forward is not None:
            return
        model_runner = getattr(runner, "model_runner", None)
        eager_forward = getattr(model_runner, "model_forward", None)
        static_buckets = getattr(runner, "static_buckets", None)
        if eager_forward is None or not static_buckets:
            raise TypeError(
                "tc_piecewise needs a runner with static_buckets whose model_runner has "
                "model_forward(input_ids, positions) -> hidden (the traceable part of its forward); "
                f"got {type(runner).__name__} with model runner {type(model_runner).__name__}"
            )
        batch = static_buckets[max(static_buckets)].batch
        with enable_tc_piecewise_cuda_graph():
            # The compiled forward is read from the context inside the step; the tc_piecewise flag stays on around it.
            compiled = compile_model_forward(
                eager_forward,
                lambda: model_runner.forward(batch),  # type: ignore[union-attr]
                (batch.input_ids, batch.positions),
                self.compiler,
                self.compile_stats,
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
            raise RuntimeError("TcPiecewiseCudaGraphBackend.prepare(runner) must run before capture_session()")
        with super().capture_session(stream), enable_tc_piecewise_cuda_graph(self.model_forward):
            yield

    def _capture(
        self, shape: int, forward_fn: Callable[[], Any], stream: torch.cuda.Stream, pool: GraphPool
    ) -> GraphEntry:
        self._piece_mode, self._piece_shape = "capture", shape
        try:
            with torch.cuda.stream(stream):  # the split ops run between the pieces, on the capture stream
                output = forward_fn()
        except BaseException:
            _ShapeGraphs(self, shape).reset()
            raise
        finally:
            self._piece_mode = None
        return GraphEntry(
            shape=shape, graph=_ShapeGraphs(self, shape), replay=self._bind_replay(shape, forward_fn), output=output
        )

    def _bind_replay(self, shape: int, forward_fn: Callable[[], Any]) -> Callable[[], Any]:
        model_forward = self.model_forward

        def replay() -> Any:
            self._piece_mode, self._piece_shape = "replay", shape
            try:
                with model_capture_mode(), enable_tc_piecewise_cuda_graph(model_forward):
                    return forward_fn()
            finally:
                self._piece_mode = None

        return replay

    # -- replay -----------------------------------------------------------------------------------------------------

    def replay(self, shape: int, *, static_inputs: Sequence[torch.Tensor] | None = None) -> Any:
        """Run ``shape``'s pieces from their graphs with the split ops eager between them; return the forward's
        result (a new tensor each step)."""
        entry = self.entries.get(shape)
        if entry is None:
            raise KeyError(
                f"shape {shape} was not captured by this {self.backend} backend; captured: {list(self.shapes)}"
            )
        if self.options.debug and static_inputs is not None:
            entry.check_input_addresses(static_inputs)
        output = entry.replay()
        recompiles = self.compile_stats.recompiles_at_replay
        if recompiles != self._recompiles_reported:
            logger.warning(
                "tc_piecewise recompiled the model forward after capture (%d time(s)): a dynamo guard failed, so "
                "some steps ran without graphs (a bug: report the shapes replayed)",
                recompiles,
            )
            self._recompiles_reported = recompiles
        return output

    def runtime_session(self) -> contextlib.AbstractContextManager[None]:
        """The tc_piecewise flag and the compiled forward, around one step of replays."""
        return enable_tc_piecewise_cuda_graph(self.model_forward)

    def cleanup(self) -> None:
        """Free every piece's graphs and the pool; the compiled forward is kept, so a new capture does not
        recompile."""
        super().cleanup()
        for piece in self._pieces:
            for shape in list(piece.entries):
                piece.discard(shape)
        for split in self._splits:
            split.entries.clear()
