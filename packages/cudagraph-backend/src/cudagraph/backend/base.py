"""The backend contract: capture one shape at a time into one shared pool, replay it by shape, clean up.

A backend decides *how* a shape is captured and replayed; which shapes exist and how inputs reach the static
buffers is the runner's job. Outputs are held without owning their pool memory, so each captured shape's output is
valid until the next replay of any graph in the same pool (the pool reuses that memory across shapes).
"""

from __future__ import annotations

import abc
import contextlib
import functools
import gc
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypedDict

import torch

from cudagraph.backend_utils import (
    CaptureOptions,
    GraphPool,
    MemoryReading,
    ShapeDescriptor,
    default_capture_stream,
    model_capture_mode,
    read_device_memory,
    require_cuda,
    weak_ref_tensors,
)
from cudagraph.config import Backend, Phase

from .compile_forward import CompileStats
from .entry_inputs import EntryInputs
from .errors import CUDA_GRAPH_CAPTURE_FAILED_HINT, CudaGraphCaptureError


def _nothing_to_replay() -> None:
    return None


def _replay_then_return(replay: Callable[[], Any], output: Any) -> Any:
    replay()
    return output


@dataclass
class GraphEntry:
    """Everything captured for one shape (a backend keeps one per shape, keyed by it): the graph, the bound replay
    callable, the static output and, in debug mode, where the static inputs were at capture."""

    shape: int
    """The shape: the runner's bucket (decode: batch size; prefill: token count)."""
    graph: Any
    """A ``torch.cuda.CUDAGraph`` or ``BreakableCUDAGraph`` (``None`` when the forward launched no work)."""
    replay: Callable[[], Any]
    """Bound once at capture, so replay does no lookups (tc_piecewise's returns the step's output)."""
    output: Any
    """The static output (weakly held unless ``CaptureOptions.weak_ref_outputs`` is off)."""
    input_addresses: tuple[int, ...] = ()
    """Data pointers of the static inputs at capture (recorded in debug mode when the runner passes them)."""

    def check_input_addresses(self, static_inputs: Sequence[torch.Tensor]) -> None:
        """Raise if ``static_inputs`` are not where they were at capture (the graph would read stale memory)."""
        addresses = tuple(tensor.data_ptr() for tensor in static_inputs)
        if addresses == self.input_addresses:
            return
        moved = [
            f"input {index}: {before:#x} -> {after:#x}"
            for index, (before, after) in enumerate(zip(self.input_addresses, addresses, strict=False))
            if before != after
        ]
        raise RuntimeError(
            f"shape {self.shape}: static inputs are not where the graph was captured to read them "
            f"({'; '.join(moved) or f'{len(self.input_addresses)} inputs at capture, {len(addresses)} now'}); "
            f"copy new values into the captured buffers instead of passing new tensors"
        )

    def release(self) -> None:
        """Free the graph; the entry must not be replayed afterwards."""
        if self.graph is not None:
            self.graph.reset()
        self.graph = None
        self.replay = _nothing_to_replay
        self.output = None


class BackendArgs(TypedDict, total=False):
    """The keyword arguments of every backend (``BaseCudaGraphBackend``'s), which a subclass takes and passes on
    whole (``**common: Unpack[BackendArgs]``)."""

    phase: Phase | str | None
    options: CaptureOptions | None
    pool: GraphPool | None
    share_global_pool: bool


def release_entries(entries: dict[ShapeDescriptor, GraphEntry]) -> None:
    """Free the graph of every entry in ``entries`` and empty it (the end of a scratch session, or a cleanup)."""
    for entry in entries.values():
        entry.release()
    entries.clear()


class BaseCudaGraphBackend(abc.ABC):
    """Capture and replay of one phase's shapes: warm-ups, capture into a shared pool, replay by shape, cleanup.

    Args:
        device: the CUDA device (raises ``CudaGraphsUnavailableError`` without CUDA).
        phase: the phase this backend serves (only used in messages).
        options: the capture switches (warm-ups, debug address checks, weak outputs, capture error mode, and the
            breakable ones); default ``CaptureOptions()``.
        pool: the ``GraphPool`` to capture into; default: one on the process-wide pool when ``share_global_pool``,
            else a private one, made at the first capture session.
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
        options: CaptureOptions | None = None,
        pool: GraphPool | None = None,
        share_global_pool: bool = True,
    ) -> None:
        self.device = require_cuda(device)
        self.phase = Phase(phase) if phase is not None else None
        self.options = options if options is not None else CaptureOptions()
        self.pool: GraphPool | None = pool
        self.share_global_pool = share_global_pool
        self.entries: dict[ShapeDescriptor, GraphEntry] = {}
        """Per-shape capture state, keyed by the shape's ``ShapeDescriptor`` (``descriptor(shape)``)."""
        self.capture_stream: torch.cuda.Stream | None = None
        self._session_stream: torch.cuda.Stream | None = None
        self.compile_stats: CompileStats | None = None
        """What compiling the model forward cost, for a backend that compiles it (``None`` for one that does not)."""
        self.descriptors: dict[int, ShapeDescriptor] = {}
        """The shape descriptor of each shape, as ``prepare`` was given them (empty before it)."""

    # -- capture ----------------------------------------------------------------------------------------------------

    def prepare(self, model_forward: Callable[..., Any] | None, entries: Mapping[int, EntryInputs]) -> None:
        """Take what this backend graphs, before a runner's capture loop: ``model_forward``, the forward a compiling
        backend traces (``model_forward(input_ids, positions) -> hidden``; ``None`` when the host has none), and each
        entry's ``EntryInputs`` by shape (its ``ShapeDescriptor`` and static inputs).

        The base keeps the descriptors (``descriptor``); tc_piecewise, and full with ``compile_max_shape``, compile
        ``model_forward`` here. Nothing here reads the caller: a backend graphs what it is given.
        """
        self.descriptors = {shape: inputs.descriptor for shape, inputs in entries.items()}

    def descriptor(self, shape: int) -> ShapeDescriptor:
        """The ``ShapeDescriptor`` of ``shape``: the one ``prepare`` was given (a verify runner's knows its tokens per
        request), else by this backend's phase (decode: one token a request; prefill or no phase: tokens)."""
        descriptor = self.descriptors.get(shape)
        if descriptor is not None:
            return descriptor
        if self.phase is Phase.DECODE:
            return ShapeDescriptor.decode(shape)
        return ShapeDescriptor.prefill(shape)

    @property
    def graphs_outlive_sleep(self) -> bool:
        """Whether this backend's graphs keep their memory at the same addresses across an engine's sleep: their pool
        is one a sleep unmaps and a wake maps back (``SleepMemory.graph_pool``), or nothing is captured yet."""
        return self.pool is None or self.pool.keeper is not None

    def ensure_pool(self) -> GraphPool:
        """The pool this backend captures into, made on first use (on the process-wide handle, if shared)."""
        if self.pool is None:
            self.pool = GraphPool.shared(self.device) if self.share_global_pool else GraphPool.create(self.device)
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
            # Keeps the pool valid while failed captures are freed; released by cleanup().
            self.ensure_pool().hold(stream)
        with torch.cuda.device(self.device), model_capture_mode():
            torch.cuda.synchronize(self.device)
            self._session_stream = stream
            try:
                yield
            finally:
                self._session_stream = None
                torch.cuda.current_stream(self.device).wait_stream(stream)
                if self.compile_stats is not None:
                    # Anything compiled from here on compiled at replay: a guard failed.
                    self.compile_stats.compilations_at_capture = self.compile_stats.compilations

    def capture_one(
        self, shape: int, forward_fn: Callable[[], Any], *, static_inputs: Sequence[torch.Tensor] = ()
    ) -> Any:
        """Warm ``forward_fn`` up ``options.num_warmups`` times, capture it as ``shape``, return its static output.

        Must run inside ``capture_session``. Capturing a shape again replaces the old graph. On any failure
        (exception, out-of-memory, op illegal under capture) nothing of this shape is kept and one
        ``CudaGraphCaptureError`` names the shape and the cause.
        """
        stream = self._session_stream
        if stream is None:
            raise RuntimeError(f"{type(self).__name__}.capture_one({shape}) must run inside `with capture_session():`")
        self.discard(shape)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        pool = self.ensure_pool()
        forward_fn = self._forward_for_shape(shape, forward_fn)
        try:
            with torch.cuda.stream(stream):
                for _ in range(self.options.num_warmups):
                    forward_fn()
            entry = self._capture(shape, forward_fn, stream, pool)
        except Exception as cause:
            # torch may still route allocations to the pool after a failed capture: later shapes use a new handle,
            # graphs already captured keep the old one alive.
            pool.renew()
            pool.hold(stream)
            raise CudaGraphCaptureError(shape, str(self.backend), cause, CUDA_GRAPH_CAPTURE_FAILED_HINT) from cause
        if self.options.weak_ref_outputs:
            # The pool may give this memory to the next (smaller) capture: graphs in one pool never run together.
            entry.output = weak_ref_tensors(entry.output)
        if self.options.debug:
            entry.input_addresses = tuple(tensor.data_ptr() for tensor in static_inputs)
        self.entries[self.descriptor(shape)] = entry
        return entry.output

    def _forward_for_shape(self, shape: int, forward_fn: Callable[[], Any]) -> Callable[[], Any]:
        """What is warmed up and captured for ``shape`` (``forward_fn`` itself unless a backend wraps it)."""
        return forward_fn

    @abc.abstractmethod
    def _capture(
        self, shape: int, forward_fn: Callable[[], Any], stream: torch.cuda.Stream, pool: GraphPool
    ) -> GraphEntry:
        """Capture ``forward_fn`` on ``stream`` into ``pool``; free everything captured if it fails."""

    def warm_up(self, shape: int, forward_fn: Callable[[], Any]) -> None:
        """Run ``forward_fn`` once as a warm-up of ``shape`` runs (on the capture stream, inside ``capture_session``),
        capturing nothing: what it allocates is freed when it returns, and what it loads for good (kernels, the
        stream's library workspaces) is loaded before a measurement starts."""
        stream = self._session_stream
        if stream is None:
            raise RuntimeError(f"{type(self).__name__}.warm_up({shape}) must run inside `with capture_session():`")
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self._forward_for_shape(shape, forward_fn)()
        torch.cuda.current_stream(self.device).wait_stream(stream)

    @contextlib.contextmanager
    def scratch_session(self) -> Iterator[None]:
        """A ``capture_session`` into a private pool of its own: every shape captured in it, and the pool, are freed
        when it ends, and the graphs captured before it are neither seen nor touched (for measuring what a capture
        takes without keeping it)."""
        if self._session_stream is not None:
            raise RuntimeError(f"{type(self).__name__}: a scratch session cannot open inside a capture session")
        kept_pool, kept_entries = self.pool, self.entries
        self.pool, self.entries = GraphPool.create(self.device), {}
        try:
            with self.capture_session():
                yield
        finally:
            release_entries(self.entries)
            self.pool.release()
            self.pool, self.entries = kept_pool, kept_entries
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    def renew_pool(self) -> None:
        """Drop this backend's hold on its pool, so that the pool's memory returns to the device once nothing else
        uses it, and capture into the pool ``ensure_pool`` gives from now on (held for the open capture session, if
        any; a new one unless another backend still captures into the shared pool). Only while this backend keeps
        no graph, since graphs live in their pool."""
        if self.entries:
            raise RuntimeError(
                f"{type(self).__name__}.renew_pool(): shapes {list(self.shapes)} still hold graphs in the pool; "
                f"discard them first"
            )
        if self.pool is not None:
            self.pool.release()
        self.pool = None
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        if self._session_stream is not None:
            self.ensure_pool().hold(self._session_stream)

    def memory_reading(self, *, settle: bool = True, reset_peak: bool = False) -> MemoryReading:
        """This backend's device memory now (``settle=False``: no sync, no cache flush; ``reset_peak``: the peak
        restarts after this reading; see ``read_device_memory``).

        Runners account for capture memory through this, so they never ask a device for readings themselves.
        """
        return read_device_memory(self.device, settle=settle, reset_peak=reset_peak)

    # -- replay -----------------------------------------------------------------------------------------------------

    def has_shape(self, shape: int) -> bool:
        """Whether ``shape`` has been captured."""
        return self.descriptor(shape) in self.entries

    @property
    def shapes(self) -> tuple[int, ...]:
        """Captured shapes, ascending."""
        return tuple(sorted(entry.shape for entry in self.entries.values()))

    def entry(self, shape: int) -> GraphEntry:
        """What was captured for ``shape`` (a ``KeyError`` naming the captured shapes if it was not)."""
        entry = self.entries.get(self.descriptor(shape))
        if entry is None:
            raise KeyError(
                f"shape {shape} was not captured by this {self.backend} backend; captured: {list(self.shapes)}"
            )
        return entry

    def replay(self, shape: int, *, static_inputs: Sequence[torch.Tensor] | None = None) -> Any:
        """Replay ``shape`` and return its static output (valid until the next replay of any graph in the pool).

        In debug mode, ``static_inputs`` (the tensors passed at capture) are checked to still be at their
        capture-time addresses.
        """
        entry = self.entry(shape)
        if self.options.debug and static_inputs is not None:
            entry.check_input_addresses(static_inputs)
        entry.replay()
        return entry.output

    def replay_fn(self, shape: int) -> Callable[[], Any]:
        """A zero-argument callable doing what ``runtime_session`` plus ``replay(shape)`` do, bound once for a
        runner's hot path: it returns the step's output and does no lookups (a backend with a runtime session,
        tc_piecewise, enters it around the bound replay). Valid until ``shape`` is captured again, discarded or cleaned
        up."""
        entry = self.entry(shape)
        if type(self).runtime_session is not BaseCudaGraphBackend.runtime_session:
            return functools.partial(self._replay_in_session, entry)
        return functools.partial(_replay_then_return, entry.replay, entry.output)

    def _replay_in_session(self, entry: GraphEntry) -> Any:
        with self.runtime_session():
            entry.replay()
            return entry.output

    def runtime_session(self) -> contextlib.AbstractContextManager[None]:
        """Context manager around one step of replays (full and breakable need none; tc_piecewise sets its flag)."""
        return contextlib.nullcontext()

    # -- teardown ---------------------------------------------------------------------------------------------------

    def discard(self, shape: int) -> None:
        """Free the graph of ``shape`` if it was captured."""
        entry = self.entries.pop(self.descriptor(shape), None)
        if entry is not None:
            entry.release()

    def cleanup(self) -> None:
        """Free every graph and output and release the pool, so that the memory returns to the device.

        A later capture session starts a new pool (on the same capture stream).
        """
        release_entries(self.entries)
        if self.pool is not None:
            self.pool.release()
        self.pool = None
        # Objects made while capturing were frozen for the capture (``freeze_gc``) and then sit in the oldest
        # generation; a reference cycle among them that still holds a pool tensor (a compiled piece's output, say)
        # would keep the pool's segments until the next full collection, which may never come before ``wake``.
        gc.collect()
        # The capture stream is kept: torch keeps a cuBLAS workspace per stream for the life of the process, so a
        # new stream per capture session would grow memory with every recapture.
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device}, shapes={list(self.shapes)})"
