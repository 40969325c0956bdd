"""The errors the primitives raise, the one check that a CUDA device exists, and the one walk of an error's chain."""

from __future__ import annotations

from collections.abc import Iterator

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


def exception_chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and every exception it holds on to through ``__cause__`` and ``__context__``, each once: ``error``
    first, then depth first, a cause before a context.

    Both links are followed whatever ``__suppress_context__`` says (``raise ... from None`` hides the context from
    the printed traceback, but the error still keeps it, and its frames, alive). An exception met twice is yielded
    once, so a chain that loops back on itself (an error set as the context of its own cause) ends.

    Example:
        >>> try:
        ...     try:
        ...         raise KeyError("slot")
        ...     except KeyError as cause:
        ...         raise RuntimeError("capturing shape 8 failed") from cause
        ... except RuntimeError as error:
        ...     [type(link).__name__ for link in exception_chain(error)]
        ['RuntimeError', 'KeyError']
    """
    seen: set[int] = set()
    pending: list[BaseException] = [error]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        # Pushed context first, so the cause is walked first.
        pending += [link for link in (current.__context__, current.__cause__) if link is not None]
