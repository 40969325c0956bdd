"""How one shape is captured and replayed: the full, breakable and tc_piecewise backends behind one factory,
`make_backend`.
"""

from .base import BaseCudaGraphBackend, GraphEntry
from .breakable import BreakableCudaGraphBackend
from .compile_forward import CompileStats
from .entry_inputs import EntryInputs
from .errors import (
    CUDA_GRAPH_CAPTURE_FAILED_HINT,
    TC_PIECEWISE_CUDA_GRAPH_CAPTURE_FAILED_MSG,
    BackendUnavailableError,
    CudaGraphCaptureError,
)
from .factory import BACKEND_CLASSES, WARMUPS_NEEDED, make_backend, warmups_needed
from .full import FullCudaGraphBackend
from .inductor_fallbacks import custom_ops_of, ops_of_namespace, register_inductor_fallbacks
from .tc_piecewise import (
    ModelTraceError,
    PiecewiseCompiler,
    PiecewiseStats,
    SplitGraph,
    TcPiecewiseCudaGraphBackend,
    split_at_split_ops,
    split_graph,
)

__version__ = "0.1.0"

__all__ = [
    "BACKEND_CLASSES",
    "CUDA_GRAPH_CAPTURE_FAILED_HINT",
    "TC_PIECEWISE_CUDA_GRAPH_CAPTURE_FAILED_MSG",
    "WARMUPS_NEEDED",
    "BackendUnavailableError",
    "BaseCudaGraphBackend",
    "BreakableCudaGraphBackend",
    "CompileStats",
    "CudaGraphCaptureError",
    "EntryInputs",
    "FullCudaGraphBackend",
    "GraphEntry",
    "ModelTraceError",
    "PiecewiseCompiler",
    "PiecewiseStats",
    "SplitGraph",
    "TcPiecewiseCudaGraphBackend",
    "__version__",
    "custom_ops_of",
    "make_backend",
    "ops_of_namespace",
    "register_inductor_fallbacks",
    "split_at_split_ops",
    "split_graph",
    "warmups_needed",
]
