"""``make_backend``: the one way to get a backend for a phase, with every disallowed pair rejected by name."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch

from cudagraph.backend_utils import CaptureOptions, GraphPool
from cudagraph.config import ALLOWED_BACKENDS_PER_PHASE, Backend, Phase, backend_for_phase, read_phase

from .base import BackendArgs, BaseCudaGraphBackend
from .breakable import BreakableCudaGraphBackend
from .errors import BackendUnavailableError
from .full import FullCudaGraphBackend
from .tc_piecewise import TcPiecewiseCudaGraphBackend

BACKEND_CLASSES: Mapping[Backend, type[BaseCudaGraphBackend] | None] = MappingProxyType(
    {
        Backend.FULL: FullCudaGraphBackend,
        Backend.BREAKABLE: BreakableCudaGraphBackend,
        Backend.TC_PIECEWISE: TcPiecewiseCudaGraphBackend,
    }
)
"""The class behind each graph backend; ``None`` marks one that is valid in a config but not built yet."""

WARMUPS_NEEDED: Mapping[Backend, int] = MappingProxyType(
    {Backend.FULL: 1, Backend.BREAKABLE: 1, Backend.TC_PIECEWISE: 2}
)
"""Eager runs before each capture that a backend's correctness needs. One run does every lazy first-call setup
(kernel JIT and specialization for the shape, library handles and workspaces, allocator growth) outside the graph;
a compiled forward needs a second, because its first call compiles and only the second runs what is captured."""


def warmups_needed(backend: Backend | str, *, compile_max_shape: int = 0) -> int:
    """How many warm-up runs before each capture ``backend`` needs (two wherever a compiled forward is captured:
    tc_piecewise, and full graphs with ``compile_max_shape``).

    Example:
        >>> warmups_needed("full"), warmups_needed("full", compile_max_shape=8), warmups_needed("tc_piecewise")
        (1, 2, 2)
    """
    backend = Backend(backend)
    if backend is Backend.FULL and compile_max_shape > 0:
        return WARMUPS_NEEDED[Backend.TC_PIECEWISE]
    return WARMUPS_NEEDED[backend]


def make_backend(
    phase: Phase | str,
    backend: Backend | str,
    device: torch.device | str | int | None = None,
    *,
    options: CaptureOptions | None = None,
    pool: GraphPool | None = None,
    share_global_pool: bool = True,
    tc_piecewise_compiler: str | None = None,
    compile_max_shape: int = 0,
    compile_mode: str | None = None,
    compile_cache_dir: str | None = None,
) -> BaseCudaGraphBackend:
    """The backend that captures ``phase`` with ``backend`` on ``device``.

    Raises ``ConfigError`` for an unknown phase or backend or a pair the phase does not allow (``disabled``, which means
    "run eagerly", is the config's decision: never ask for its backend); ``BackendUnavailableError`` for a backend not
    built in this release; ``CudaGraphsUnavailableError`` on a machine without CUDA. ``options``, ``pool`` and
    ``share_global_pool`` go to the backend's constructor, ``tc_piecewise_compiler`` (``eager`` or ``inductor``; default
    ``eager``) to the tc_piecewise backend only, ``compile_max_shape`` (shapes up to it capture an inductor-compiled
    forward; ``--torch-compile-max-bs``) to the full backend only, and ``compile_mode`` (the ``torch.compile`` mode of
    whatever inductor compiles, one of ``TORCH_COMPILE_MODES``; ``--torch-compile-mode``) to both of those;
    ``compile_cache_dir`` (inductor's cache directory) to tc_piecewise.
    """
    phase = read_phase("make_backend phase", phase)
    backend = backend_for_phase("make_backend backend", backend, phase)
    # ``disabled`` is the config's decision that the phase runs eagerly (``PhaseConfig.enabled``): no caller asks.
    assert backend is not Backend.DISABLED, f"the {phase} phase runs eagerly: check its `enabled` before making one"
    backend_class = BACKEND_CLASSES[backend]
    if backend_class is None:
        allowed = ALLOWED_BACKENDS_PER_PHASE[phase]
        available = ", ".join(str(name) for name, cls in BACKEND_CLASSES.items() if cls is not None and name in allowed)
        raise BackendUnavailableError(
            f"the {backend} CUDA-graph backend is not available yet in this release of cudagraph-backend; "
            f"for the {phase} phase use {available} instead, or disable its graphs"
        )
    common = BackendArgs(phase=phase, options=options, pool=pool, share_global_pool=share_global_pool)
    if backend_class is TcPiecewiseCudaGraphBackend:
        return TcPiecewiseCudaGraphBackend(
            device,
            compiler=tc_piecewise_compiler or "eager",
            compile_mode=compile_mode,
            compile_cache_dir=compile_cache_dir,
            **common,
        )
    if backend_class is FullCudaGraphBackend:
        return FullCudaGraphBackend(device, compile_max_shape=compile_max_shape, compile_mode=compile_mode, **common)
    return backend_class(device, **common)
