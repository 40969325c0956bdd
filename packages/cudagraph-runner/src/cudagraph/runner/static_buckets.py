"""What a runner has captured, as one object: its static buckets, the capture and release of one bucket, the route
table, and the record of where the graphs' inputs live.

``StaticBuckets`` is shared by everything that changes what is captured: the runner (``capture``, ``shutdown``),
the capture loop (``cudagraph.runner.capture_loop``), the capture on first use (``cudagraph.runner.lazy_capture``)
and sleep and wake (``cudagraph.runner.lifecycle``). They reach it only through its public methods, so a rule such
as "releasing a bucket forgets its address record" is written here once.

A runner's hot path reads three of its attributes per step (``by_size``, ``beyond``, ``wrong_mode``: the route
table bound apart) and one entry (``buckets[bucket]``). What it must never do: read a batch, or decide a route (the
``RouteTable`` it is given decides).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cudagraph.backend import BaseCudaGraphBackend
from cudagraph.backend_utils import ForwardContext, ForwardContextScope

from .forward_batch import ForwardBatch
from .graph_inputs import GraphInputGuard
from .routing import EagerReason, Route, RouteTable
from .static_buffers import StaticBuffers
from .stats import BucketCaptureStats

logger = logging.getLogger(__name__)

NO_CONTEXT = contextlib.nullcontext()
"""The ``with`` block of a bucket whose replay reads no forward context (stateless, so one serves every bucket)."""


@dataclass
class StaticBucket:
    """What one bucket replays with, made once: the batch viewing the static buffers that its graph was captured
    with, the forward context its eager breaks read at replay and the ``with`` block that sets it, and (after
    capture) the backend's bound replay and its output sliced to every row count that replays this bucket."""

    batch: ForwardBatch
    forward_context: ForwardContext
    context_scope: contextlib.AbstractContextManager[Any] = NO_CONTEXT
    """Sets ``forward_context`` around a replay (a no-op block when the backend computes attention metadata inside
    the graph, so nothing reads the context at replay)."""
    replay: Callable[[], Any] | None = None
    """The backend's ``replay_fn`` for this bucket: replays and returns the output."""
    output: Any = None
    """The static output the capture returned (what ``replay`` returns, for backends whose output is static)."""
    output_rows: dict[int, torch.Tensor] = field(default_factory=dict)
    """``output[:rows]`` for every row count a replay of this bucket returns."""

    def bind_replay(self, replay: Callable[[], Any], output: Any, row_counts: Iterable[int]) -> None:
        """Keep the bound replay and its output, with the output's first ``rows`` rows for each of ``row_counts``."""
        self.replay = replay
        self.output = output
        self.output_rows = {rows: output[:rows] for rows in row_counts} if isinstance(output, torch.Tensor) else {}

    def release(self) -> None:
        """Forget the bound replay and output (the bucket's graph was released; its batches run eagerly)."""
        self.replay = None
        self.output = None
        self.output_rows = {}

    def rows_of(self, logits: Any, rows: int) -> Any:
        """``logits[:rows]``, a view made at capture when ``logits`` is the static output (no allocation)."""
        if logits is self.output:
            view = self.output_rows.get(rows)
            if view is not None:
                return view
        return logits[:rows]


def _profiler_activities() -> list[torch.profiler.ProfilerActivity]:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities


class StaticBuckets(Mapping[int, StaticBucket]):
    """The captured buckets of one runner (see the module docstring): ``buckets[bucket]`` is a ``StaticBucket``.

    ``capture_bucket(bucket)`` is how its owner captures one bucket (the runner's ``capture_bucket``, which feeds
    the bucket's attention metadata and calls ``bind``): the capture loop and the capture on first use go through
    it, so a runner subclass that overrides it is called for every bucket.
    """

    def __init__(
        self,
        backend: BaseCudaGraphBackend,
        graph_inputs: GraphInputGuard,
        capture_bucket: Callable[[int], object],
        *,
        phase: object,
        profile_capture: bool = False,
    ) -> None:
        self.backend = backend
        self.graph_inputs = graph_inputs
        """Where each graph's weights and caches were when it was captured (``refresh_graphs`` checks them)."""
        self.phase = phase
        self.profile_capture = profile_capture
        """Capture the first bucket of a loop under torch.profiler (``--enable-profile-cuda-graph``)."""
        self.profile_trace: Path | None = None
        """Where the torch.profiler trace of the first (largest) capture went, with ``profile_capture``."""
        self.pending: set[int] = set()
        """Planned buckets a step captures on first use (lazy policy; empty otherwise): read on every step."""
        self._capture_bucket = capture_bucket
        self._entries: dict[int, StaticBucket] = {}
        self.close_routes(EagerReason.NOT_CAPTURED)

    # -- the static buckets -----------------------------------------------------------------------------------------

    def __getitem__(self, bucket: int) -> StaticBucket:
        return self._entries[bucket]

    def __iter__(self) -> Iterator[int]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def index(
        self,
        buffers: StaticBuffers,
        buckets: Iterable[int],
        static_batch: Callable[[int], ForwardBatch],
        attn_backend: Any,
        *,
        scoped: bool,
    ) -> None:
        """One ``StaticBucket`` per bucket over ``buffers``: its static batch and the forward context its eager breaks
        read (set around each replay when ``scoped``; otherwise the graph reads no context and the block is
        skipped)."""
        self.buffers = buffers
        """The static buffers every static batch views (padded again before a capture on first use)."""
        self._entries = {}
        for bucket in buckets:
            batch = static_batch(bucket)
            context = ForwardContext(forward_batch=batch, attn_backend=attn_backend, extra={})
            self._entries[bucket] = StaticBucket(batch, context, ForwardContextScope(context) if scoped else NO_CONTEXT)

    def clear(self) -> None:
        """Drop every static bucket (the static buffers they view are being released)."""
        self._entries.clear()

    # -- capture and release of one bucket --------------------------------------------------------------------------

    def bind(
        self,
        bucket: int,
        forward_fn: Callable[[], Any],
        row_counts: Iterable[int],
        static_inputs: list[torch.Tensor] | None = None,
    ) -> Any:
        """Capture ``forward_fn`` as ``bucket``'s graph, bind its replay and output to the static bucket and record
        where the graph reads its inputs; the static output. ``static_inputs`` (debug mode): the static buffers the
        backend checks before every replay."""
        if static_inputs is not None:
            output = self.backend.capture_one(bucket, forward_fn, static_inputs=static_inputs)
        else:
            output = self.backend.capture_one(bucket, forward_fn)
        self._entries[bucket].bind_replay(self.backend.replay_fn(bucket), output, row_counts)
        self.graph_inputs.record(bucket)
        return output

    def capture_timed(self, bucket: int, first: bool = False) -> BucketCaptureStats:
        """Capture ``bucket`` (its owner's ``capture_bucket``) and say what it cost (``first``: a loop's first
        bucket, captured under torch.profiler when ``profile_capture`` is on)."""
        if first and self.profile_capture:
            with torch.profiler.profile(activities=_profiler_activities()) as profiler:
                stats = self.capture_timed(bucket)
            self._export_profile(profiler, bucket)
            return stats
        started = time.perf_counter()
        # Per bucket, the allocator's reserved growth (no sync, no cache flush, so the loop stays fast); the total in
        # ``capture`` is the honest driver-side figure, which also counts instantiated graphs.
        reserved_before = self.backend.memory_reading(settle=False).reserved_bytes
        self._capture_bucket(bucket)
        used = max(0, self.backend.memory_reading(settle=False).reserved_bytes - reserved_before)
        return BucketCaptureStats(bucket=bucket, seconds=time.perf_counter() - started, bytes=used)

    def _export_profile(self, profiler: torch.profiler.profile, bucket: int) -> None:
        """Write the profile of ``bucket``'s capture and log where it went."""
        descriptor, trace = tempfile.mkstemp(prefix=f"cudagraph-capture-{self.phase}-{bucket}-", suffix=".json")
        os.close(descriptor)
        profiler.export_chrome_trace(trace)
        self.profile_trace = Path(trace)
        logger.info(
            "profile of the %s capture of bucket %s: %s (open in chrome://tracing or Perfetto)",
            self.phase,
            bucket,
            trace,
        )

    def release(self, bucket: int) -> None:
        """Free the graph of ``bucket`` and what its static bucket bound to it (its batches then run eagerly)."""
        self.backend.discard(bucket)
        self._entries[bucket].release()
        self.graph_inputs.forget(bucket)

    def release_all(self) -> None:
        """Free every graph and the pool they live in, forget their bindings, address records and pending buckets;
        the static buffers (and the static batches viewing them) stay."""
        self.backend.cleanup()
        for entry in self._entries.values():
            entry.release()
        self.graph_inputs.clear()
        self.pending = set()

    # -- the route table --------------------------------------------------------------------------------------------

    def open_routes(self, table: RouteTable) -> None:
        """Answer steps from ``table`` (built from the buckets that hold graphs or are pending)."""
        self.routes: RouteTable = table
        """Every route the runner answers (see ``cudagraph.runner.routing``)."""
        # Bound apart, so a step's route reads one attribute and one list entry.
        self.by_size: tuple[Route, ...] = table.by_size
        self.beyond: Route = table.beyond
        self.wrong_mode: Route = table.wrong_mode

    def close_routes(self, reason: EagerReason) -> None:
        """Every step eager for ``reason`` (before capture, after ``shutdown``, asleep, or fallen back)."""
        self.open_routes(RouteTable.closed(reason))

    def route_of_size(self, size: int) -> Route:
        """The route of a step of ``size`` in a graphed mode."""
        by_size = self.by_size
        return by_size[size] if 0 <= size < len(by_size) else self.beyond
