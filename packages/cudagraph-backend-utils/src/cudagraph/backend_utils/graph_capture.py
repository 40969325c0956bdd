"""Begin, end and abort one stream capture into a shared pool, leaving nothing behind when it fails.

``torch.cuda.graph(...)`` synchronizes and empties the allocator cache on every entry, which is wasted work when a
forward is captured as many segments; these helpers call ``capture_begin``/``capture_end`` directly instead. When a
capture fails (an exception in the captured code, an out-of-memory, an op that is illegal under capture), the
stream capture is ended, the partial graph freed and the pool released, so that the next capture starts clean.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from .memory import GraphPoolHandle

CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")
"""``cudaStreamCaptureMode`` names torch accepts; ``global`` catches unsafe calls from any thread (the default)."""

# torch warns with this text when a capture recorded no work; such a segment is dropped instead of replayed.
_EMPTY_GRAPH_WARNING = "CUDA Graph is empty"

T = TypeVar("T")


def begin_capture(pool: GraphPoolHandle, capture_error_mode: str = "global") -> torch.cuda.CUDAGraph:
    """Start capturing the current stream into a new graph that allocates from ``pool``."""
    if capture_error_mode not in CAPTURE_ERROR_MODES:
        raise ValueError(f"capture_error_mode {capture_error_mode!r} is not one of {', '.join(CAPTURE_ERROR_MODES)}")
    graph = torch.cuda.CUDAGraph()
    graph.capture_begin(pool=pool, capture_error_mode=capture_error_mode)
    return graph


def end_capture(graph: torch.cuda.CUDAGraph, pool: GraphPoolHandle) -> bool:
    """End ``graph``'s capture; return whether it recorded any work (an empty graph is freed at once).

    If ending fails (the capture was invalidated), the graph and its claim on ``pool`` are released before the
    error propagates, so the caller has nothing left to clean up. Capture the next graphs into a fresh pool then:
    some torch versions keep routing host-side allocations of the failed capture to ``pool``, and a new capture
    into the same handle fails with "already recording to mempool_id".
    """
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            graph.capture_end()
    except BaseException:
        _release_failed_capture(graph, pool)
        raise
    empty = False
    for warning in caught:
        if _EMPTY_GRAPH_WARNING in str(warning.message):
            empty = True
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    if empty:
        graph.reset()
    return not empty


def anchor_pool(pool: GraphPoolHandle, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    """An empty graph captured into ``pool``, holding a reference to it until ``reset()``.

    torch frees a graph pool (and refuses to capture into its handle again) once the last graph using it is reset.
    Graphs come and go while captures into a shared pool run: an empty segment is dropped, a failed capture is
    freed. Holding this anchor keeps the pool valid throughout; it costs no device memory.
    """
    anchor = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=f".*{_EMPTY_GRAPH_WARNING}.*")
        anchor.capture_begin(pool=pool)
        anchor.capture_end()
    return anchor


def abort_capture(graph: torch.cuda.CUDAGraph, pool: GraphPoolHandle) -> None:
    """End a capture that failed part-way and free everything it recorded; never raises."""
    try:
        recorded = end_capture(graph, pool)
    except Exception:
        return  # end_capture already released the graph and the pool
    if recorded:
        graph.reset()


def _release_failed_capture(graph: torch.cuda.CUDAGraph, pool: GraphPoolHandle) -> None:
    # When the driver rejects the end of a capture (it was invalidated), torch versions up to at least 2.11 raise
    # before telling the allocator that the capture is over, and their reset() then skips the graph's reference to
    # the pool: end the routing and drop that reference here, or the allocator keeps routing to a dead capture and
    # the pool is never freed. Newer versions end the routing themselves (ending it again raises) and release the
    # pool in reset(), so the reference is dropped here only when the routing was still open.
    device = torch.cuda.current_device()
    try:
        torch._C._cuda_endAllocateToPool(device, pool)
    except Exception:
        routing_was_open = False
    else:
        routing_was_open = True
    if routing_was_open:
        with contextlib.suppress(Exception):
            torch._C._cuda_releasePool(device, pool)
    graph.reset()


def capture_cuda_graph(
    fn: Callable[[], T],
    *,
    pool: GraphPoolHandle,
    stream: torch.cuda.Stream,
    capture_error_mode: str = "global",
) -> tuple[torch.cuda.CUDAGraph | None, T]:
    """Capture ``fn()`` on ``stream`` as one graph in ``pool``; return the graph and ``fn``'s (static) result.

    The graph is ``None`` when ``fn`` launched no work (there is nothing to replay). On any failure the partial
    graph is freed and the original exception propagates.
    """
    with torch.cuda.stream(stream):
        graph = begin_capture(pool, capture_error_mode)
        try:
            result: Any = fn()
        except BaseException:
            abort_capture(graph, pool)
            raise
        recorded = end_capture(graph, pool)
    return (graph if recorded else None), result
