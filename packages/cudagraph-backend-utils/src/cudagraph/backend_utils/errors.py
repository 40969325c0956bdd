"""The errors the primitives raise, and the one check that a CUDA device exists."""

from __future__ import annotations

import torch


class CudaGraphsUnavailableError(RuntimeError):
    """CUDA graphs were requested on a machine (or device) without CUDA."""


class BreakableCaptureError(RuntimeError):
    """A breakable capture was used in a way that cannot replay correctly (nesting, unjoined side streams, ...)."""


def require_cuda(device: torch.device | str | int | None = None) -> torch.device:
    """The CUDA device ``device`` names (the current one when ``None``); raise if CUDA graphs cannot run there."""
    if not torch.cuda.is_available():
        raise CudaGraphsUnavailableError(
            f"CUDA graphs need a CUDA device, but torch {torch.__version__} sees none "
            f"(requested device: {device if device is not None else 'default'}); run the model eagerly instead"
        )
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    resolved = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if resolved.type != "cuda":
        raise CudaGraphsUnavailableError(
            f"CUDA graphs need a CUDA device, got device {resolved}; pass a 'cuda' device or run eagerly"
        )
    if resolved.index is None:
        resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved
