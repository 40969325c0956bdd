"""Errors the backends raise, and the capture-failure messages the legacy names point at."""

from __future__ import annotations


class CudaGraphCaptureError(RuntimeError):
    """Capturing one shape failed; the message names the shape, the backend and the original cause.

    Nothing of the failed capture is left behind (no partial graph, no output), so a later capture can succeed.
    """

    def __init__(self, shape: int, backend: str, cause: BaseException, hint: str = "") -> None:
        self.shape = shape
        self.backend = backend
        self.cause = cause
        message = f"capturing shape {shape} with the {backend} backend failed: {type(cause).__name__}: {cause}"
        super().__init__(f"{message}. {hint}" if hint else message)


class BackendUnavailableError(RuntimeError):
    """The requested backend is valid for the phase but not available in this build."""


CUDA_GRAPH_CAPTURE_FAILED_HINT = (
    "Possible fixes: capture fewer or smaller shapes (--decode-cuda-graph-max-bs / --prefill-cuda-graph-max-tokens), "
    "lower the memory fraction the KV cache takes, switch this phase's backend "
    "(--decode-cuda-graph-backend / --prefill-cuda-graph-backend), or disable graphs for the phase "
    "(--decode-disable-cuda-graph / --prefill-disable-cuda-graph)."
)
"""What a capture failure suggests to the user."""

TC_PIECEWISE_CUDA_GRAPH_CAPTURE_FAILED_MSG = (
    "tc_piecewise CUDA graph capture failed. Possible fixes: use the breakable backend for prefill "
    "(--prefill-cuda-graph-backend breakable), capture fewer tokens (--prefill-cuda-graph-max-tokens), or disable "
    "prefill graphs (--prefill-disable-cuda-graph)."
)
"""The message of a failed tc_piecewise capture (legacy name: ``PIECEWISE_CUDA_GRAPH_CAPTURE_FAILED_MSG``)."""
