"""Resolve one canonical per-phase CUDA-graph mode from JSON, per-phase flags, legacy flags and keyword arguments.

Pure Python: this package never imports torch.
"""

from .types import (
    ALLOWED_BACKENDS_PER_PHASE,
    DEFAULT_CUDA_GRAPH_MODE,
    Backend,
    ConfigError,
    CudaGraphConfig,
    Phase,
    PhaseConfig,
)

__version__ = "0.1.0"

__all__ = [
    "ALLOWED_BACKENDS_PER_PHASE",
    "DEFAULT_CUDA_GRAPH_MODE",
    "Backend",
    "ConfigError",
    "CudaGraphConfig",
    "Phase",
    "PhaseConfig",
    "__version__",
]
