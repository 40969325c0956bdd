"""Compiling the pieces of a split graph: the ``torch.compile`` backend of ``tc_piecewise`` and its piece compilers.

Workflow of ``PiecewiseCompiler`` (called by dynamo once per traced graph):

1. ``split_graph`` cuts the graph at the registered split ops.
2. The split module is run once on dynamo's fake inputs, so every piece gets example inputs that carry the graph's
   symbolic token size (one compilation then serves every bucket).
3. Each piece goes to the ``PieceCompiler``: ``EagerPieceCompiler`` keeps the traced module, ``InductorPieceCompiler``
   compiles it with ``compile_fx``. Pieces with the same structure and input metadata (one per decoder layer, whose
   weights are inputs) are compiled once and share the compiled callable.
4. Each compiled piece and each split call is handed to the backend's wrapper callbacks, which put what captures them
   in their place in the split module.

The inductor cache (FX graphs, AOTAutograd, Triton kernels and autotuning results) lives under
``InductorPieceCompiler.cache_dir`` when one is set (torch's ``TORCHINDUCTOR_CACHE_DIR`` otherwise), so a second
process reuses the first one's kernels; ``PiecewiseStats`` says how many pieces compiled and how many were shared.
Inductor's Triton kernels go to ``TRITON_CACHE_DIR`` instead where that is set; Triton's own JIT cache (kernels a
model launches itself, ``~/.triton/cache`` by default) is Triton's to place, not moved here (the package README's
"The compile caches").

Not here: capturing or replaying anything (``wrappers`` and ``sequence``), or choosing what to compile (the backend).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, cast

import torch
import torch.fx

from cudagraph.config import TC_PIECEWISE_COMPILERS, ConfigError, read_torch_compile_mode

from ..compile_forward import CompileStats, inductor_mode_options
from ..inductor_fallbacks import custom_ops_of, register_inductor_fallbacks
from .split import SplitGraph, split_graph

logger = logging.getLogger(__name__)

__all__ = [
    "EagerPieceCompiler",
    "InductorPieceCompiler",
    "PieceCompiler",
    "PiecewiseCompiler",
    "PiecewiseStats",
    "make_piece_compiler",
    "piece_structure_key",
]

CACHE_DIR_ENV = "TORCHINDUCTOR_CACHE_DIR"
"""Where torch's inductor keeps its caches (FX graphs, AOTAutograd, Triton kernels, autotuning)."""


@dataclass
class PiecewiseStats(CompileStats):
    """``CompileStats`` plus the shape of the latest split and what compiling its pieces cost."""

    pieces: int = 0
    """Pieces of the latest graph (split ops + 1 for a model whose first and last ops are not splits)."""
    split_ops: int = 0
    """Split-op calls of the latest graph (eager between pieces)."""
    pieces_compiled: int = 0
    """Pieces handed to the compiler (the others reused the compiled callable of a piece of the same structure)."""
    pieces_reused: int = 0
    """Pieces that reused another piece's compiled callable (one decoder layer's piece serves every layer)."""
    cache_dir: str | None = None
    """The inductor cache directory the compile used (``None`` for the eager compiler)."""

    def summary(self) -> str:
        """One phrase for the log: compilations, pieces compiled and shared, seconds, cache use and where."""
        shared = f"{self.pieces_compiled} piece(s) compiled, {self.pieces_reused} shared"
        where = f", cache {self.cache_dir}" if self.cache_dir else ""
        return f"{super().summary()}, {shared}{where}"


class PieceCompiler(Protocol):
    """Compiles one piece of a split graph for the example inputs it will be called with (symbolic token size)."""

    @property
    def name(self) -> str:
        """The compiler's name (``eager``, ``inductor``), shown in logs."""
        ...

    cache_dir: str | None

    def compile(self, piece: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        """A callable with the piece's calling convention (positional tensors and sizes in, its outputs out)."""
        ...


class EagerPieceCompiler:
    """Keeps each piece as traced: its ``GraphModule`` runs op by op (the kernels of eager PyTorch)."""

    name: ClassVar[str] = "eager"
    cache_dir: str | None = None

    def compile(self, piece: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        """``piece`` itself."""
        return piece


class InductorPieceCompiler:
    """Compiles each piece with inductor's ``compile_fx`` (Triton kernels, fused pointwise ops).

    ``compile_fx`` and not ``compile_fx_inner``: the pieces come straight from dynamo, not yet functionalized, and
    ``compile_fx`` runs AOTAutograd first; and not ``torch.compile`` of each piece, which would trace again and guard
    each piece on its own shapes.

    Args:
        mode: ``torch.compile`` mode, one of ``cudagraph.config.TORCH_COMPILE_MODES`` (``None``: inductor's
            defaults); its inductor config patches go to ``compile_fx``.
        cache_dir: the inductor cache directory; set for the whole process at the first compile, since kernels
            autotune and load from it at their first run too (``None``: ``TORCHINDUCTOR_CACHE_DIR`` or torch's
            default).
    """

    name: ClassVar[str] = "inductor"

    def __init__(self, mode: str | None = None, cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.mode = mode
        self.config_patches = inductor_mode_options(mode, "tc_piecewise compile mode")
        self.requested_cache_dir = None if cache_dir is None else Path(cache_dir).expanduser().resolve()
        self.cache_dir: str | None = None
        """The cache directory in use (known after the first compile)."""

    def compile(self, piece: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        """``compile_fx(piece, example_inputs)`` with the mode's config patches, under the cache directory (the
        fallbacks of the custom ops the piece calls registered first: ``register_inductor_fallbacks``)."""
        from torch._inductor.compile_fx import compile_fx

        self._use_cache_dir()
        register_inductor_fallbacks(custom_ops_of(piece))
        return cast(
            Callable[..., Any], compile_fx(piece, list(example_inputs), config_patches=dict(self.config_patches))
        )

    def _use_cache_dir(self) -> None:
        if self.cache_dir is not None:
            return
        if self.requested_cache_dir is not None:
            previous = os.environ.get(CACHE_DIR_ENV)
            if previous is not None and Path(previous).resolve() != self.requested_cache_dir:
                logger.info("tc_piecewise: inductor cache moves from %s to %s", previous, self.requested_cache_dir)
            self.requested_cache_dir.mkdir(parents=True, exist_ok=True)
            os.environ[CACHE_DIR_ENV] = str(self.requested_cache_dir)
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        self.cache_dir = cache_dir()


def make_piece_compiler(
    compiler: str, mode: str | None = None, cache_dir: str | os.PathLike[str] | None = None
) -> PieceCompiler:
    """The piece compiler named ``compiler`` (one of ``TC_PIECEWISE_COMPILERS``); a ``ConfigError`` otherwise."""
    if compiler not in TC_PIECEWISE_COMPILERS:
        raise ConfigError(f"unknown tc_piecewise compiler {compiler!r}; allowed: {', '.join(TC_PIECEWISE_COMPILERS)}")
    if mode is not None:
        read_torch_compile_mode("tc_piecewise compile mode", mode)
    if compiler == "inductor":
        return InductorPieceCompiler(mode, cache_dir)
    return EagerPieceCompiler()


def _input_meta(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"T({value.dtype},{tuple(value.shape)},{value.stride()},{value.device.type},{value.requires_grad})"
    return f"{type(value).__name__}({value})"


def piece_structure_key(piece: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str:
    """A key equal for two pieces exactly when one's compiled callable computes the other: the same nodes in the same
    order over the same input metadata, placeholder names ignored (each layer's weights are differently named
    inputs), attributes and submodules by identity (a constant of one piece is not another's).

    Example:
        >>> import torch
        >>> a = torch.fx.symbolic_trace(lambda weight_a, x: x @ weight_a)
        >>> b = torch.fx.symbolic_trace(lambda weight_b, x: x @ weight_b)
        >>> inputs = [torch.ones(2, 2), torch.ones(1, 2)]
        >>> piece_structure_key(a, inputs) == piece_structure_key(b, inputs)
        True
    """
    numbers: dict[torch.fx.Node, str] = {}
    lines: list[str] = []
    for position, node in enumerate(piece.graph.nodes):
        numbers[node] = f"%{position}"
        if node.op == "placeholder":
            lines.append("placeholder")
            continue
        if node.op == "call_module":
            target = f"module#{id(piece.get_submodule(node.target))}"
        elif node.op == "get_attr":
            target = f"attr#{id(_attr(piece, node.target))}"
        else:
            target = getattr(node.target, "__qualname__", None) or repr(node.target)
            target = f"{getattr(node.target, '__module__', '')}.{target}"
        arguments = torch.fx.node.map_arg((node.args, node.kwargs), lambda used: numbers[used])
        lines.append(f"{node.op}|{target}|{arguments!r}")
    lines.append(";".join(_input_meta(value) for value in example_inputs))
    return "\n".join(lines)


def _attr(module: torch.nn.Module, target: str) -> object:
    value: object = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


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


def piece_example_inputs(split: SplitGraph, example_inputs: Sequence[Any]) -> dict[str, tuple[Any, ...]]:
    """The (fake, symbolic) arguments each piece of ``split`` receives when the graph gets ``example_inputs``.

    Must run under the ``torch.compile`` call that traced the graph: dynamo's fake mode makes the inputs, so they
    carry its symbolic token size, which every piece shares.
    """
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode(example_inputs)
    if fake_mode is None:
        raise RuntimeError("tc_piecewise with inductor must be called by torch.compile (no fake mode is active)")
    fake_inputs = [
        fake_mode.from_tensor(value) if isinstance(value, torch.Tensor) else value for value in example_inputs
    ]
    recorder = _PieceInputRecorder(split.module, split.piece_names)
    with fake_mode, enable_python_dispatcher():
        recorder.run(*fake_inputs)
    return recorder.inputs


PieceWrapper = Callable[[int, Callable[..., Any]], Callable[..., Any]]
"""``wrap_piece(index, compiled_piece) -> callable``: what runs in the split graph in place of piece ``index``."""

SplitWrapper = Callable[[int, torch.fx.GraphModule], Callable[..., Any]]
"""``wrap_split(index, split_submodule) -> callable``: what runs in the split graph in place of split-op call
``index`` (a submodule holding that one call)."""


class PiecewiseCompiler:
    """A ``torch.compile`` backend: split at the registered split ops, compile each piece, wrap each piece.

    Args:
        compiler: ``eager`` or ``inductor`` (see ``make_piece_compiler``), or a ``PieceCompiler``.
        wrap_piece: called once per compiled piece; the backend puts its capture wrapper here (identity by default,
            so the split forward runs eagerly piece by piece: what the CPU tests check).
        wrap_split: called once per split-op submodule (identity by default).
        mode: ``torch.compile`` mode of the inductor pieces (``--torch-compile-mode``; ``None``: inductor's defaults).
        cache_dir: the inductor cache directory (see ``InductorPieceCompiler``).

    Example:
        >>> compiler = PiecewiseCompiler("eager")
        >>> compiled = torch.compile(lambda x: x.sin() + 1, backend=compiler, fullgraph=True)
        >>> bool(torch.allclose(compiled(torch.ones(3)), torch.ones(3).sin() + 1)), compiler.stats.pieces
        (True, 1)
    """

    def __init__(
        self,
        compiler: str | PieceCompiler = "eager",
        *,
        wrap_piece: PieceWrapper | None = None,
        wrap_split: SplitWrapper | None = None,
        mode: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.piece_compiler: PieceCompiler = (
            make_piece_compiler(compiler, mode, cache_dir) if isinstance(compiler, str) else compiler
        )
        self.compiler = self.piece_compiler.name
        self.mode = mode
        self.wrap_piece: PieceWrapper = wrap_piece if wrap_piece is not None else (lambda index, piece: piece)
        self.wrap_split: SplitWrapper = wrap_split if wrap_split is not None else (lambda index, split: split)
        self.stats = PiecewiseStats()
        self.split: SplitGraph | None = None
        """The latest split graph (for inspection and tests)."""

    def __call__(self, graph_module: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        """Compile one dynamo graph: split, compile the pieces, return the split module (called like the graph)."""
        split = split_graph(graph_module)
        compiled = self._compile_pieces(split, example_inputs)
        for index, name in enumerate(split.piece_names):
            # An instance attribute shadows the submodule: the split graph's `self.submod_<i>(...)` then calls the
            # wrapper directly, with no nn.Module call overhead per piece.
            split.module.__dict__[name] = self.wrap_piece(index, compiled[name])
        for index, name in enumerate(split.split_names):
            split.module.__dict__[name] = self.wrap_split(index, getattr(split.module, name))
        self.split = split
        self.stats.compilations += 1
        self.stats.pieces = len(split.piece_names)
        self.stats.split_ops = len(split.split_names)
        self.stats.cache_dir = self.piece_compiler.cache_dir
        return split.module

    def _compile_pieces(self, split: SplitGraph, example_inputs: Sequence[Any]) -> dict[str, Callable[..., Any]]:
        pieces = {name: cast(torch.fx.GraphModule, getattr(split.module, name)) for name in split.piece_names}
        if isinstance(self.piece_compiler, EagerPieceCompiler):
            self.stats.pieces_compiled += len(pieces)
            return dict(pieces)
        inputs = piece_example_inputs(split, example_inputs)
        by_structure: dict[str, Callable[..., Any]] = {}
        compiled: dict[str, Callable[..., Any]] = {}
        for name, piece in pieces.items():
            key = piece_structure_key(piece, inputs[name])
            runnable = by_structure.get(key)
            if runnable is None:
                runnable = by_structure[key] = self.piece_compiler.compile(piece, inputs[name])
                self.stats.pieces_compiled += 1
            else:
                self.stats.pieces_reused += 1
            compiled[name] = runnable
        return compiled
