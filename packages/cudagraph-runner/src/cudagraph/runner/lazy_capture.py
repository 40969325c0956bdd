"""Capture on first use (``CapturePolicy.LAZY``): nothing is captured at start-up; the first step routed to a bucket
captures it, and that step replays it.

At ``capture()`` the runner plans as the eager loop does (``plan_capture`` under the memory budget, ``agreed_plan``
across the ranks of a tensor-parallel group) but captures nothing: every planned bucket is *pending* and its sizes
route to it. The first step routed to a pending bucket calls ``LazyCapture.capture(bucket)`` before its inputs are
loaded:

1. The static buffers are padded again (a graph is captured over padding rows, as at start-up), and the bucket is
   captured in a capture session of the backend's one pool, with the garbage collector frozen (without the full
   collection the start-up loop makes first: that would cost the step about 0.1 s); the backend's
   warm-up runs come first, inside ``capture_one``, as in the loop.
2. With a budget, the bucket is captured only when what it needs (its graph, plus the pool's growth when it is
   larger than every bucket captured so far, from the estimate, times the guard's correction) fits beside what the
   runner's graphs already take; otherwise it stays eager for good, with its reason in ``skipped_buckets``, and
   its sizes route ``OVER_BUDGET``. A capture that measures over the limit is released the same way. Graphs are
   never released to make room: the buckets already captured are the ones steps use.
3. A capture that fails (out of memory, or any other error) keeps nothing of the bucket, which stays eager with the
   failure as its reason; the step runs eagerly.
4. On a tensor-parallel rank each decision (fits, captured without running out of memory) is shared through the
   group's ``agree`` (the minimum over the ranks, ``cudagraph.runner.agreement``), so a bucket that cannot be
   captured on one rank stays eager on all. Every rank routes the same steps, so they all reach this call at the
   same step and make the same calls to ``agree``.

Then the bucket's routes are kept, the step loads its inputs, refreshes attention metadata and replays as any other.
``ReplayMetrics`` counts the lazy captures and their time.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass, field

from cudagraph.backend_utils import freeze_gc, is_out_of_memory

from .agreement import ANOTHER_RANK_HAS_NO_ROOM, ANOTHER_RANK_RAN_OUT, Agree, everywhere
from .capture_loop import drop_failed_frames
from .memory_plan import OUT_OF_MEMORY_WHILE_CAPTURING, CaptureMemoryEstimate, CapturePlan, format_bytes
from .metrics import ReplayMetrics
from .static_buckets import StaticBuckets
from .stats import BucketCaptureStats

logger = logging.getLogger(__name__)


@dataclass
class LazyCapture:
    """The capture-on-first-use state of one runner's ``StaticBuckets`` (see the module docstring).

    ``pending`` is the planned buckets not captured yet (``buckets.pending``, which the runner's hot path reads);
    ``kept`` what each captured bucket cost; ``skipped`` the buckets that stay eager, with why. Each capture is
    counted in ``metrics``.
    """

    buckets: StaticBuckets
    plan: CapturePlan
    estimate: CaptureMemoryEstimate | None
    free_at_start: int
    agree: Agree
    metrics: ReplayMetrics
    backend_name: str
    kept: dict[int, BucketCaptureStats] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.buckets.pending = set(self.plan.buckets)
        self.skipped.update(self.plan.skipped)
        self._guard = self.plan.guard(self.estimate)

    @property
    def pending(self) -> set[int]:
        """Planned buckets not captured yet."""
        return self.buckets.pending

    @property
    def routable(self) -> tuple[int, ...]:
        """Buckets a step may be routed to: captured or pending, ascending."""
        return tuple(sorted({*self.kept, *self.pending}))

    def capture(self, bucket: int) -> bool:
        """Capture pending ``bucket`` for the step routed to it (see the module docstring); whether it holds a graph
        now (False: it stays eager, with its reason in ``skipped``)."""
        buckets = self.buckets
        self.pending.discard(bucket)
        started = time.perf_counter()
        buckets.buffers.pad_from(0, 0)  # captured over padding rows, as at start-up
        buckets.graph_inputs.start_session()  # weights may have moved since the last capture: read where they are now
        backend = buckets.backend
        # Inside a step: no full collection on entry (about 0.1 s in a process that imported the compiler stack).
        with freeze_gc(enable_gc=not backend.options.freeze_gc, collect_first=False), backend.capture_session():
            kept = self._capture_within_budget(bucket)
        seconds = time.perf_counter() - started
        self.metrics.count_lazy_capture(seconds)
        if kept:
            logger.info("%s bucket %d captured on first use in %.1f ms", buckets.phase, bucket, 1000 * seconds)
        else:
            gc.collect()  # what a failed capture's frames held
            logger.warning(
                "%s bucket %d stays eager (%s): %s", buckets.phase, bucket, self.backend_name, self.skipped[bucket]
            )
        return kept

    def _used_bytes(self) -> int:
        return self.free_at_start - self.buckets.backend.memory_reading().free_bytes

    def _need(self, bucket: int) -> int:
        """Bytes ``bucket`` is assumed to take: its graph, and the pool's growth when it is the largest captured."""
        guard, estimate = self._guard, self.estimate
        if guard is None or estimate is None:
            return 0
        largest_held = max(self.kept, default=None)
        pool_now = estimate.pool_bytes_for(largest_held) if largest_held is not None else 0
        growth = max(0, estimate.pool_bytes_for(bucket) - pool_now)
        return round((estimate.graph_bytes.get(bucket, 0) + growth) * guard.correction)

    def _capture_within_budget(self, bucket: int) -> bool:
        guard = self._guard
        used_before = self._used_bytes() if guard is not None else 0
        need = self._need(bucket)
        fits_here = guard is None or used_before + need <= guard.limit_bytes
        if not everywhere(self.agree, fits_here):
            self.skipped[bucket] = (
                f"over the {guard.text} budget ({format_bytes(used_before)} used, {format_bytes(need)} more needed)"
                if guard is not None and not fits_here
                else ANOTHER_RANK_HAS_NO_ROOM
            )
            return False
        failure: str | None = None
        stats = None
        try:
            stats = self.buckets.capture_timed(bucket)
        except Exception as error:
            # The step must still run, and the other ranks still wait for this rank's answer: a capture that fails
            # for any reason leaves its bucket eager, said once, rather than failing the step.
            failure = (
                OUT_OF_MEMORY_WHILE_CAPTURING
                if is_out_of_memory(error)
                else f"its capture failed on first use: {error}"
            )
            drop_failed_frames(error)
        if not everywhere(self.agree, failure is None):
            if failure is None:
                self.buckets.release(bucket)  # captured here, not on another rank: no rank may replay it
            self.skipped[bucket] = failure or ANOTHER_RANK_RAN_OUT
            return False
        assert stats is not None
        if guard is not None:
            used = self._used_bytes()
            guard.observe(need, used - used_before)
            if not everywhere(self.agree, used <= guard.limit_bytes):
                self.buckets.release(bucket)
                self.skipped[bucket] = guard.release_reason(used)
                return False
        self.kept[bucket] = stats
        return True
