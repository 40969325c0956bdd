"""The parts of the ``tc_piecewise`` backend, each usable alone.

- ``split``: ``split_graph``, a pure FX function that cuts a dynamo graph at the registered split ops.
- ``compiler``: ``PiecewiseCompiler``, the ``torch.compile`` backend that splits, compiles each piece once (eager or
  inductor, one compilation per distinct piece, under a cache directory) and wraps pieces and split calls.
- ``wrappers``: what stands in for each piece and split call; reads the graph dispatch (mode, shape descriptor).
- ``sequence``: one captured shape as a flat sequence of graph launches and bound split calls.
"""

from .compiler import (
    EagerPieceCompiler,
    InductorPieceCompiler,
    PieceCompiler,
    PiecewiseCompiler,
    PiecewiseStats,
    make_piece_compiler,
    piece_structure_key,
)
from .sequence import EagerSegments, GraphSegments, SegmentCapture, ShapeRecorder, ShapeSequence, SplitOpCall
from .split import SplitGraph, split_at_split_ops, split_graph
from .wrappers import BindableOpCall, PieceWrapper, Recordings, SplitCallWrapper

__all__ = [
    "BindableOpCall",
    "EagerPieceCompiler",
    "EagerSegments",
    "GraphSegments",
    "InductorPieceCompiler",
    "PieceCompiler",
    "PieceWrapper",
    "PiecewiseCompiler",
    "PiecewiseStats",
    "Recordings",
    "SegmentCapture",
    "ShapeRecorder",
    "ShapeSequence",
    "SplitCallWrapper",
    "SplitGraph",
    "SplitOpCall",
    "make_piece_compiler",
    "piece_structure_key",
    "split_at_split_ops",
    "split_graph",
]
