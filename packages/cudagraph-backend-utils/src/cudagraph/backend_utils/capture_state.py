"""Capture-state flags: whether the model is being captured, and by which kind of capture.

Each flag is a ``contextvars.ContextVar`` set by a context manager and read by a plain function, so nesting restores
the outer value and each thread sees only its own captures. Nothing here touches CUDA.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

_CAPTURE_MODE: ContextVar[bool] = ContextVar("cudagraph_capture_mode", default=False)
_IN_BREAKABLE_CUDA_GRAPH: ContextVar[bool] = ContextVar("cudagraph_in_breakable_cuda_graph", default=False)
_IN_TC_PIECEWISE_CUDA_GRAPH: ContextVar[bool] = ContextVar("cudagraph_in_tc_piecewise_cuda_graph", default=False)
_IN_TORCH_COMPILE_WARMUP: ContextVar[bool] = ContextVar("cudagraph_in_torch_compile_warmup", default=False)
_COMPILED_MODEL_FORWARD: ContextVar[Callable[..., Any] | None] = ContextVar(
    "cudagraph_compiled_model_forward", default=None
)


@contextlib.contextmanager
def _flag_set(flag: ContextVar[bool]) -> Iterator[None]:
    token = flag.set(True)
    try:
        yield
    finally:
        flag.reset(token)


def is_capture_mode() -> bool:
    """Whether a graph capture (or its warm-up runs) is in progress: attention backends take their graph path."""
    return _CAPTURE_MODE.get()


def model_capture_mode() -> contextlib.AbstractContextManager[None]:
    """Context manager under which ``is_capture_mode()`` is true.

    Example:
        >>> with model_capture_mode():
        ...     assert is_capture_mode()
        >>> is_capture_mode()
        False
    """
    return _flag_set(_CAPTURE_MODE)


def is_in_breakable_cuda_graph() -> bool:
    """Whether a breakable capture is recording in this thread (set by ``BreakableCUDAGraph.capture``)."""
    return _IN_BREAKABLE_CUDA_GRAPH.get()


def breakable_cuda_graph_active() -> contextlib.AbstractContextManager[None]:
    """Context manager under which ``is_in_breakable_cuda_graph()`` is true (the breakable capture enters it)."""
    return _flag_set(_IN_BREAKABLE_CUDA_GRAPH)


def is_in_tc_piecewise_cuda_graph() -> bool:
    """Whether the torch.compile piecewise backend is capturing or replaying in this thread."""
    return _IN_TC_PIECEWISE_CUDA_GRAPH.get()


@contextlib.contextmanager
def enable_tc_piecewise_cuda_graph(model_forward: Callable[..., Any] | None = None) -> Iterator[None]:
    """Context manager under which ``is_in_tc_piecewise_cuda_graph()`` is true and ``compiled_model_forward()``
    returns ``model_forward`` (the compiled model forward the host runner must call instead of its eager one)."""
    with use_compiled_model_forward(model_forward), _flag_set(_IN_TC_PIECEWISE_CUDA_GRAPH):
        yield


@contextlib.contextmanager
def use_compiled_model_forward(model_forward: Callable[..., Any] | None) -> Iterator[None]:
    """Context manager under which ``compiled_model_forward()`` returns ``model_forward``.

    A backend that compiles the model forward (``tc_piecewise``, or ``full`` with compiled small buckets) enters it
    around its warm-ups and captures, so the host model runner runs the compiled forward there and eagerly elsewhere.

    Example:
        >>> with use_compiled_model_forward(print):
        ...     assert compiled_model_forward() is print
        >>> compiled_model_forward() is None
        True
    """
    token = _COMPILED_MODEL_FORWARD.set(model_forward)
    try:
        yield
    finally:
        _COMPILED_MODEL_FORWARD.reset(token)


def compiled_model_forward() -> Callable[..., Any] | None:
    """The compiled model forward of the backend capturing or replaying in this thread, else ``None``.

    A host model runner calls it in place of its own traceable model forward (same arguments), so each backend's
    capture and replay run that backend's compiled forward, and every other run stays eager.
    """
    return _COMPILED_MODEL_FORWARD.get()


def is_in_torch_compile_warmup() -> bool:
    """Whether torch.compile is tracing or warming up the piecewise model (no graphs are captured then)."""
    return _IN_TORCH_COMPILE_WARMUP.get()


def enable_torch_compile_warmup() -> contextlib.AbstractContextManager[None]:
    """Context manager under which ``is_in_torch_compile_warmup()`` is true."""
    return _flag_set(_IN_TORCH_COMPILE_WARMUP)
