"""The graph memory pool: create, share, capture into, recover after a failed capture, release.

``GraphPool`` is the only code in the workspace that touches the caching allocator's pool hooks
(``torch.cuda.graph_pool_handle``, ``CUDAGraph.capture_begin(pool=...)`` and the private
``torch._C._cuda_endAllocateToPool`` / ``torch._C._cuda_releasePool``). Every backend and the breakable primitive go
through it, so the rules those hooks impose live in one place:

- graphs captured into one pool reuse each other's memory, so a process captures every shape into one pool;
- torch frees a pool (and refuses to capture into its handle again) once the last graph using it is reset, so a
  pool being captured into is held by an empty *anchor* graph until ``release()``;
- after a failed capture some torch versions keep routing allocations to the pool, so the next captures go to a
  fresh handle (``renew()``), while graphs already captured keep the old one alive.

``torch.cuda.graph(...)`` synchronizes and empties the allocator cache on every entry, which is wasted work when a
forward is captured as many segments; ``begin_capture``/``end_capture`` call ``capture_begin``/``capture_end``
directly instead. Everything here imports without CUDA; creating a pool needs a device.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from .errors import require_cuda

GraphPoolHandle = Any
"""What ``torch.cuda.graph_pool_handle()`` returns (an opaque id tuple); it does not keep memory alive by itself."""

CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")
"""``cudaStreamCaptureMode`` names torch accepts; ``global`` catches unsafe calls from any thread (the default)."""

# torch warns with this text when a capture recorded no work; such a graph is dropped instead of replayed.
_EMPTY_GRAPH_WARNING = "CUDA Graph is empty"

T = TypeVar("T")


class GraphPool:
    """One graph memory pool: the only code that calls the caching allocator's pool hooks (see the module docstring).

    Make one with ``GraphPool.create(device)`` (a private pool), ``GraphPool.shared(device)`` (the process-wide pool
    every backend captures into by default) or ``GraphPool.adopt(handle)`` (a handle made elsewhere, e.g. by legacy
    code through ``set_global_graph_memory_pool``). ``handle`` is what torch APIs taking ``pool=`` accept; it changes
    when ``renew()`` moves the pool to a fresh handle after a failed capture.

    Example (on a CUDA machine)::

        pool = GraphPool.create("cuda")
        pool.hold(stream)                       # keep it valid while graphs come and go
        graph, output = pool.capture(forward, stream=stream)
        ...
        graph.reset()
        pool.release()                          # the memory returns once no graph uses it
    """

    __slots__ = ("_anchor", "_device", "_open_scopes", "_retired_anchors", "handle", "keeper", "scope")

    def __init__(
        self,
        handle: GraphPoolHandle,
        device: torch.device | None = None,
        *,
        scope: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
        keeper: object = None,
    ) -> None:
        self.handle: GraphPoolHandle = handle
        self._device = device
        self._anchor: torch.cuda.CUDAGraph | None = None
        self._retired_anchors: list[torch.cuda.CUDAGraph] = []
        self.scope = scope
        """Entered around every capture into this pool (and its release), on the capturing thread: the settings an
        allocator behind the pool needs (``SleepMemory.capturing``); ``None`` for the caching allocator's own pools."""
        self.keeper = keeper
        """What keeps the pool alive for the process's life whatever graphs come and go (a ``torch.cuda.MemPool`` of
        sleepable memory), or ``None``: the pool is freed once no graph and no anchor uses it."""
        self._open_scopes: list[contextlib.ExitStack] = []

    @classmethod
    def create(cls, device: torch.device | str | int | None = None) -> GraphPool:
        """A new pool on ``device`` (raises ``CudaGraphsUnavailableError`` without CUDA)."""
        resolved = require_cuda(device)
        with torch.cuda.device(resolved):
            return cls(torch.cuda.graph_pool_handle(), resolved)

    @classmethod
    def adopt(cls, handle: GraphPoolHandle, device: torch.device | str | int | None = None) -> GraphPool:
        """Wrap a handle made elsewhere (``device``: where it was made; default: the current device when used)."""
        return cls(handle, None if device is None else torch.device(device))

    @classmethod
    def of(cls, pool: GraphPool | GraphPoolHandle) -> GraphPool:
        """``pool`` itself if it is a ``GraphPool``, else the handle adopted."""
        return pool if isinstance(pool, GraphPool) else cls.adopt(pool)

    @classmethod
    def shared(cls, device: torch.device | str | int | None = None) -> GraphPool:
        """A pool on the process-wide handle, which the first call creates on ``device`` and publishes.

        Each caller gets its own object on the one handle, so each holds and releases the pool for itself: one
        backend cleaning up never pulls the pool from under another that still captures into it.
        """
        global _GLOBAL_POOL
        if _GLOBAL_POOL is None:
            _GLOBAL_POOL = cls.create(device)
            return _GLOBAL_POOL
        shared = cls.adopt(_GLOBAL_POOL.handle, device)
        shared.scope, shared.keeper = _GLOBAL_POOL.scope, _GLOBAL_POOL.keeper
        return shared

    @property
    def device(self) -> torch.device:
        """The CUDA device the pool lives on."""
        return self._device if self._device is not None else require_cuda()

    @property
    def is_shared(self) -> bool:
        """Whether this pool's handle is the process-wide one (``get_global_graph_memory_pool()``)."""
        return _GLOBAL_POOL is not None and _GLOBAL_POOL.handle == self.handle

    # -- keeping the pool valid -------------------------------------------------------------------------------------

    def hold(self, stream: torch.cuda.Stream) -> None:
        """Keep the pool valid until ``release()``, however many graphs come and go (idempotent).

        An empty graph captured on ``stream`` holds a reference to the pool; it costs no device memory.
        """
        if self._anchor is not None:
            return
        anchor = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=f".*{_EMPTY_GRAPH_WARNING}.*")
            anchor.capture_begin(pool=self.handle)
            anchor.capture_end()
        self._anchor = anchor

    def renew(self) -> None:
        """Capture into a fresh handle from now on (after a failed capture; see ``end_capture``).

        Graphs captured into the old handle keep it alive; its anchor is kept until ``release()``. When the old
        handle was the process-wide one, the new one is published in its place, so no later capture goes to it.
        """
        global _GLOBAL_POOL
        if self.keeper is not None:
            # A kept pool (sleepable memory) is its allocator's only pool for graphs: a fresh caching-allocator handle
            # would give later graphs memory a sleep frees. Its keeper holds it, and the failed capture's routing was
            # ended when its graph was released, so captures go on into the same handle.
            return
        was_shared = self.is_shared
        if self._anchor is not None:
            self._retired_anchors.append(self._anchor)
            self._anchor = None
        with torch.cuda.device(self.device):
            self.handle = torch.cuda.graph_pool_handle()
        if was_shared:
            _GLOBAL_POOL = self

    def release(self) -> None:
        """Drop this object's anchors, so torch frees the pool once no graph (and no other holder) uses it; the
        object published as the process-wide pool is unpublished, so the next shared capture starts a new pool.

        Capturing into the same handle again needs ``torch.cuda.empty_cache()`` first; prefer a new pool.
        """
        global _GLOBAL_POOL
        if self.keeper is not None:
            # A kept pool (sleepable memory) is never given back: capturing again into a pool all of whose graphs were
            # released breaks torch's bookkeeping of the pinned host blocks its captures used. Released graphs give
            # their blocks back to it; the next capture reuses them.
            return
        for anchor in [*self._retired_anchors, self._anchor]:
            if anchor is not None:
                anchor.reset()
        self._retired_anchors.clear()
        self._anchor = None
        if _GLOBAL_POOL is self:
            _GLOBAL_POOL = None

    # -- capturing into the pool ------------------------------------------------------------------------------------

    def begin_capture(self, capture_error_mode: str = "global") -> torch.cuda.CUDAGraph:
        """Start capturing the current stream into a new graph that allocates from this pool."""
        if capture_error_mode not in CAPTURE_ERROR_MODES:
            raise ValueError(
                f"capture_error_mode {capture_error_mode!r} is not one of {', '.join(CAPTURE_ERROR_MODES)}"
            )
        graph = torch.cuda.CUDAGraph()
        scope = contextlib.ExitStack()
        if self.scope is not None:
            scope.enter_context(self.scope())
        try:
            graph.capture_begin(pool=self.handle, capture_error_mode=capture_error_mode)
        except BaseException:
            scope.close()
            raise
        self._open_scopes.append(scope)
        return graph

    def _close_scope(self) -> None:
        """Leave the scope the latest ``begin_capture`` entered (captures into one pool do not interleave)."""
        if self._open_scopes:
            self._open_scopes.pop().close()

    def end_capture(self, graph: torch.cuda.CUDAGraph) -> bool:
        """End ``graph``'s capture; return whether it recorded any work (an empty graph is freed at once).

        If ending fails (the capture was invalidated), the graph and its claim on the pool are released before the
        error propagates, so the caller has nothing left to clean up. Capture the next graphs after ``renew()``:
        some torch versions keep routing host-side allocations of the failed capture to the old handle, and a new
        capture into it fails with "already recording to mempool_id".
        """
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                graph.capture_end()
        except BaseException:
            self._release_failed_capture(graph)
            raise
        finally:
            self._close_scope()
        empty = False
        for warning in caught:
            if _EMPTY_GRAPH_WARNING in str(warning.message):
                empty = True
            else:
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        if empty:
            graph.reset()
        return not empty

    def abort_capture(self, graph: torch.cuda.CUDAGraph) -> None:
        """End a capture that failed part-way and free everything it recorded; never raises."""
        try:
            recorded = self.end_capture(graph)
        except Exception:
            return  # end_capture already released the graph and its claim on the pool
        if recorded:
            graph.reset()

    def capture(
        self, fn: Callable[[], T], *, stream: torch.cuda.Stream, capture_error_mode: str = "global"
    ) -> tuple[torch.cuda.CUDAGraph | None, T]:
        """Capture ``fn()`` on ``stream`` as one graph; return the graph and ``fn``'s (static) result.

        The graph is ``None`` when ``fn`` launched no work (there is nothing to replay). On any failure the partial
        graph is freed and the original exception propagates.
        """
        with torch.cuda.stream(stream):
            graph = self.begin_capture(capture_error_mode)
            try:
                result: Any = fn()
            except BaseException:
                self.abort_capture(graph)
                raise
            recorded = self.end_capture(graph)
        return (graph if recorded else None), result

    def _release_failed_capture(self, graph: torch.cuda.CUDAGraph) -> None:
        # The one place that calls the allocator's private pool hooks. When the driver rejects the end of a capture
        # (it was invalidated), torch versions up to at least 2.11 raise before telling the allocator that the
        # capture is over, and their reset() then skips the graph's reference to the pool: end the routing and drop
        # that reference here, or the allocator keeps routing to a dead capture and the pool is never freed. Newer
        # versions end the routing themselves (ending it again raises) and release the pool in reset(), so the
        # reference is dropped here only when the routing was still open.
        device = torch.cuda.current_device()
        try:
            torch._C._cuda_endAllocateToPool(device, self.handle)
        except Exception:
            routing_was_open = False
        else:
            routing_was_open = True
        if routing_was_open:
            with contextlib.suppress(Exception):
                torch._C._cuda_releasePool(device, self.handle)
        graph.reset()

    def __repr__(self) -> str:
        shared = ", shared" if self.is_shared else ""
        return f"GraphPool(handle={self.handle!r}, anchored={self._anchor is not None}{shared})"


_GLOBAL_POOL: GraphPool | None = None


def get_global_graph_memory_pool() -> GraphPoolHandle | None:
    """The handle of the pool every backend of this process captures into by default (``None`` before the first
    capture, or after the backend that made it cleaned up)."""
    return _GLOBAL_POOL.handle if _GLOBAL_POOL is not None else None


def set_global_graph_memory_pool(pool: GraphPool | GraphPoolHandle | None) -> None:
    """Make ``pool`` (a ``GraphPool`` or a handle) the process-wide default; ``None`` forgets it, so the next capture
    makes a new one. Setting the handle the current pool already has changes nothing."""
    global _GLOBAL_POOL
    if pool is None or isinstance(pool, GraphPool):
        _GLOBAL_POOL = pool
    elif _GLOBAL_POOL is None or _GLOBAL_POOL.handle != pool:
        _GLOBAL_POOL = GraphPool.adopt(pool)


def new_graph_pool(device: torch.device | str | int | None = None) -> GraphPoolHandle:
    """A fresh pool's handle on ``device``, for APIs that take a bare handle (``GraphPool.create(device).handle``)."""
    return GraphPool.create(device).handle


def capture_cuda_graph(
    fn: Callable[[], T],
    *,
    pool: GraphPool | GraphPoolHandle,
    stream: torch.cuda.Stream,
    capture_error_mode: str = "global",
) -> tuple[torch.cuda.CUDAGraph | None, T]:
    """Capture ``fn()`` on ``stream`` as one graph in ``pool`` (``GraphPool.capture`` for a pool or a bare handle)."""
    return GraphPool.of(pool).capture(fn, stream=stream, capture_error_mode=capture_error_mode)
