"""The backend contract: capture one shape at a time into one shared pool, replay it by shape, clean up.

A backend decides *how* a shape is captured and replayed; which shapes exist and how inputs reach the static
buffers is the runner's job. Outputs are held without owning their pool memory, so each captured shape's output is
valid until the next replay of any graph in the same pool (the pool reuses that memory across shapes).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from cudagraph.backend_utils import (
    GraphPoolHandle,
    anchor_pool,
    default_capture_stream,
    get_global_graph_memory_pool,
    model_capture_mode,
    new_graph_pool,
    require_cuda,
    set_global_graph_memory_pool,
    weak_ref_tensors,
)
from cudagraph.config import Backend, Phase

from .errors import CUDA_GRAPH_CAPTURE_FAILED_HINT, CudaGraphCaptureError


def _nothing_to_replay() -> None:
    return None


@dataclass
class GraphEntry:
    """One captured shape: its graph, the bound replay callable, its static output and (debug) input addresses."""

    shape: int
    graph: Any
    """A ``torch.cuda.CUDAGraph`` or ``BreakableCUDAGraph`` (``None`` when the forward launched no work)."""
    replay: Callable[[], None]
    """Bound once at capture, so replay does no lookups."""
    output: Any
    """The static output (weakly held by default)."""
    input_addresses: tuple[int, ...] = ()
    """Data pointers of the static inputs at capture (recorded in debug mode when the runner passes them)."""

    def release(self) -> None:
        """Free the graph; the entry must not be replayed afterwards."""
        if self.graph is not None:
            self.graph.reset()
        self.graph = None
        self.replay = _nothing_to_replay
        self.output = None


class BaseCudaGraphBackend(abc.ABC):
    """Capture and replay of one phase's shapes: warm-ups, capture into a shared pool, replay by shape, cleanup.

    Args:
        device: the CUDA device (raises ``CudaGraphsUnavailableError`` without CUDA).
        phase: the phase this backend serves (only used in messages).
        num_warmups: eager runs of the forward before each capture (lazy initialization, autotuning, allocator).
        debug: record static-input addresses at capture and check them at replay (``replay(..., static_inputs=)``).
        pool: graph pool handle to capture into; default: the global pool (created and published if unset) when
            ``share_global_pool``, else a private one.
        weak_outputs: hold outputs without pinning their pool memory (default); ``False`` keeps them alive.
        capture_error_mode: as in ``torch.cuda.graph``.
    """

    backend: ClassVar[Backend]
    captures_attn_metadata: ClassVar[bool]
    """True when the attention metadata is computed inside the graph (full); False when it is computed outside,
    before every replay (breakable, tc_piecewise)."""

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        *,
        phase: Phase | str | None = None,
        num_warmups: int = 2,
        debug: bool = False,
        pool: GraphPoolHandle | None = None,
        share_global_pool: bool = True,
        weak_outputs: bool = True,
        capture_error_mode: str = "global",
    ) -> None:
        self.device = require_cuda(device)
        if num_warmups < 0:
            raise ValueError(f"num_warmups must be >= 0, got {num_warmups}")
        self.phase = Phase(phase) if phase is not None else None
        self.num_warmups = num_warmups
        self.debug = debug
        self.pool: GraphPoolHandle | None = pool
        self.share_global_pool = share_global_pool
        self.weak_outputs = weak_outputs
        self.capture_error_mode = capture_error_mode
        self.entries: dict[int, GraphEntry] = {}
        self.capture_stream: torch.cuda.Stream | None = None
        self._pool_anchor: torch.cuda.CUDAGraph | None = None
        self._retired_pool_anchors: list[torch.cuda.CUDAGraph] = []
        self._session_stream: torch.cuda.Stream | None = None

    # -- capture ----------------------------------------------------------------------------------------------------

    def prepare(self, runner: object) -> None:  # noqa: B027 - a hook: full and breakable need nothing here
        """Called by a runner before its capture loop (tc_piecewise compiles the model here)."""

    def ensure_pool(self) -> GraphPoolHandle:
        """The pool this backend captures into, created (and published as the global one, if shared) on first use."""
        if self.pool is None:
            shared = get_global_graph_memory_pool() if self.share_global_pool else None
            self.pool = shared if shared is not None else new_graph_pool(self.device)
            if self.share_global_pool and shared is None:
                set_global_graph_memory_pool(self.pool)
        return self.pool

    @contextlib.contextmanager
    def capture_session(self, stream: torch.cuda.Stream | None = None) -> Iterator[None]:
        """Capture mode on, one shared pool, one side capture stream (``stream``; default: the one this backend used
        before, else the device's default capture stream, so that pool blocks are reused across captures)."""
        if self._session_stream is not None:
            raise RuntimeError(f"{type(self).__name__}: a capture session is already open; sessions do not nest")
        with torch.cuda.device(self.device):
            if stream is None:
                stream = self.capture_stream if self.capture_stream is not None else default_capture_stream()
            self.capture_stream = stream
            pool = self.ensure_pool()
            if self._pool_anchor is None:
                # Keeps the pool valid while failed captures are freed (see anchor_pool); released by cleanup().
                self._pool_anchor = anchor_pool(pool, stream)
        with torch.cuda.device(self.device), model_capture_mode():
            torch.cuda.synchronize(self.device)
            self._session_stream = stream
            try:
                yield
            finally:
                self._session_stream = None
                torch.cuda.current_stream(self.device).wait_stream(stream)

    def capture_one(
        self, shape: int, forward_fn: Callable[[], Any], *, static_inputs: Sequence[torch.Tensor] = ()
    ) -> Any:
        """Warm ``forward_fn`` up ``num_warmups`` times, capture it as ``shape``, and return its static output.

        Must run inside ``capture_session``. Capturing a shape again replaces the old graph. On any failure
        (exception, out-of-memory, op illegal under capture) nothing of this shape is kept and one
        ``CudaGraphCaptureError`` names the shape and the cause.
        """
        stream = self._session_stream
        if stream is None:
            raise RuntimeError(f"{type(self).__name__}.capture_one({shape}) must run inside `with capture_session():`")
        self.discard(shape)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        try:
            with torch.cuda.stream(stream):
                for _ in range(self.num_warmups):
                    forward_fn()
            entry = self._capture(shape, forward_fn, stream)
        except Exception as cause:
            self._move_to_fresh_pool(stream)
            raise CudaGraphCaptureError(shape, str(self.backend), cause, CUDA_GRAPH_CAPTURE_FAILED_HINT) from cause
        if self.weak_outputs:
            # The pool may give this memory to the next (smaller) capture: graphs in one pool never run together.
            entry.output = weak_ref_tensors(entry.output)
        if self.debug:
            entry.input_addresses = tuple(tensor.data_ptr() for tensor in static_inputs)
        self.entries[shape] = entry
        return entry.output

    def _move_to_fresh_pool(self, stream: torch.cuda.Stream) -> None:
        # After a failed capture torch may still route allocations to the pool (see end_capture), so later shapes
        # go to a new one; graphs already captured keep the old pool alive, its anchor is released by cleanup().
        if self._pool_anchor is not None:
            self._retired_pool_anchors.append(self._pool_anchor)
        published = self.pool is not None and get_global_graph_memory_pool() is self.pool
        self.pool = new_graph_pool(self.device)
        self._pool_anchor = anchor_pool(self.pool, stream)
        if published:
            set_global_graph_memory_pool(self.pool)

    @abc.abstractmethod
    def _capture(self, shape: int, forward_fn: Callable[[], Any], stream: torch.cuda.Stream) -> GraphEntry:
        """Capture ``forward_fn`` on ``stream`` into ``self.pool``; free everything captured if it fails."""

    # -- replay -----------------------------------------------------------------------------------------------------

    def has_shape(self, shape: int) -> bool:
        """Whether ``shape`` has been captured."""
        return shape in self.entries

    @property
    def shapes(self) -> tuple[int, ...]:
        """Captured shapes, ascending."""
        return tuple(sorted(self.entries))

    def replay(self, shape: int, *, static_inputs: Sequence[torch.Tensor] | None = None) -> Any:
        """Replay ``shape`` and return its static output (valid until the next replay of any graph in the pool).

        In debug mode, ``static_inputs`` (the tensors passed at capture) are checked to still be at their
        capture-time addresses.
        """
        entry = self.entries.get(shape)
        if entry is None:
            raise KeyError(
                f"shape {shape} was not captured by this {self.backend} backend; captured: {list(self.shapes)}"
            )
        if self.debug and static_inputs is not None:
            self._check_input_addresses(entry, static_inputs)
        entry.replay()
        return entry.output

    def _check_input_addresses(self, entry: GraphEntry, static_inputs: Sequence[torch.Tensor]) -> None:
        addresses = tuple(tensor.data_ptr() for tensor in static_inputs)
        if addresses != entry.input_addresses:
            moved = [
                f"input {index}: {before:#x} -> {after:#x}"
                for index, (before, after) in enumerate(zip(entry.input_addresses, addresses, strict=False))
                if before != after
            ]
            raise RuntimeError(
                f"shape {entry.shape}: static inputs are not where the graph was captured to read them "
                f"({'; '.join(moved) or f'{len(entry.input_addresses)} inputs at capture, {len(addresses)} now'}); "
                f"copy new values into the captured buffers instead of passing new tensors"
            )

    def runtime_session(self) -> contextlib.AbstractContextManager[None]:
        """Context manager around one step of replays (full and breakable need none; tc_piecewise sets its flag)."""
        return contextlib.nullcontext()

    # -- teardown ---------------------------------------------------------------------------------------------------

    def discard(self, shape: int) -> None:
        """Free the graph of ``shape`` if it was captured."""
        entry = self.entries.pop(shape, None)
        if entry is not None:
            entry.release()

    def cleanup(self) -> None:
        """Free every graph and output and drop the pool reference, so that the memory returns to the device.

        A later capture session starts a new pool (on the same capture stream).
        """
        for entry in self.entries.values():
            entry.release()
        self.entries.clear()
        for anchor in [*self._retired_pool_anchors, self._pool_anchor]:
            if anchor is not None:
                anchor.reset()
        self._retired_pool_anchors.clear()
        self._pool_anchor = None
        if self.pool is not None and get_global_graph_memory_pool() is self.pool:
            set_global_graph_memory_pool(None)
        self.pool = None
        # The capture stream is kept: torch keeps a cuBLAS workspace per stream for the life of the process, so a
        # new stream per capture session would grow memory with every recapture.
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device}, shapes={list(self.shapes)})"
