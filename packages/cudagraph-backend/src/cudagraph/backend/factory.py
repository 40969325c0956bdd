"""``make_backend``: the one way to get a backend for a phase, with every disallowed pair rejected by name."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, TypeVar

import torch

from cudagraph.config import ALLOWED_BACKENDS_PER_PHASE, Backend, ConfigError, Phase

from .base import BaseCudaGraphBackend
from .breakable import BreakableCudaGraphBackend
from .errors import BackendUnavailableError
from .full import FullCudaGraphBackend

BACKEND_CLASSES: Mapping[Backend, type[BaseCudaGraphBackend] | None] = MappingProxyType(
    {
        Backend.FULL: FullCudaGraphBackend,
        Backend.BREAKABLE: BreakableCudaGraphBackend,
        Backend.TC_PIECEWISE: None,  # not available in this release
    }
)
"""The class behind each graph backend; ``None`` marks one that is valid in a config but not built yet."""

E = TypeVar("E", bound=enum.Enum)


def _parse(kind: type[E], value: object, what: str) -> E:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(str(member.value) for member in kind)
        raise ConfigError(f"unknown CUDA-graph {what} {value!r}; allowed: {allowed}") from None


def make_backend(
    phase: Phase | str,
    backend: Backend | str,
    device: torch.device | str | int | None = None,
    *,
    num_warmups: int = 2,
    debug: bool = False,
    **options: Any,
) -> BaseCudaGraphBackend:
    """The backend that captures ``phase`` with ``backend`` on ``device``.

    Raises ``ConfigError`` for an unknown phase or backend, a pair the phase does not allow (prefill ``full``) and
    ``disabled`` (which means: run eagerly, no backend); ``BackendUnavailableError`` for ``tc_piecewise`` in this
    release; ``CudaGraphsUnavailableError`` on a machine without CUDA. ``options`` go to the backend's constructor.
    """
    phase = _parse(Phase, phase, "phase")
    backend = _parse(Backend, backend, "backend")
    allowed = ALLOWED_BACKENDS_PER_PHASE[phase]
    allowed_names = ", ".join(sorted(str(member) for member in allowed))
    if backend not in allowed:
        raise ConfigError(f"the {phase} phase cannot use the {backend} CUDA-graph backend; allowed: {allowed_names}")
    if backend is Backend.DISABLED:
        raise ConfigError(
            f"the {phase} phase is configured as {backend}: it runs eagerly and needs no graph backend "
            f"(check the phase's `enabled` before making one); graph backends: "
            f"{', '.join(sorted(str(member) for member in allowed - {Backend.DISABLED}))}"
        )
    backend_class = BACKEND_CLASSES[backend]
    if backend_class is None:
        available = ", ".join(str(name) for name, cls in BACKEND_CLASSES.items() if cls is not None and name in allowed)
        raise BackendUnavailableError(
            f"the {backend} CUDA-graph backend is not available yet in this release of cudagraph-backend; "
            f"for the {phase} phase use {available} instead, or disable its graphs"
        )
    return backend_class(device, phase=phase, num_warmups=num_warmups, debug=debug, **options)
