"""The capture loop: a runner's planned buckets, largest first, into one shared pool, within a memory budget and
through the device running out of memory.

1. Each planned bucket is captured in turn (``StaticBuckets.capture_timed``), largest first, so smaller graphs reuse
   the pool the largest one grew.
2. With a budget, ``BudgetGuard``'s rule runs around each bucket: before it, the largest graphs held are released
   until the bucket fits, or it is skipped; after it, graphs are released until the memory used is within the
   budget again. The buckets that keep graphs therefore stay a prefix of the ascending buckets.
3. A capture that runs out of device memory is freed by the backend (nothing of it stays), the graphs captured
   before it are kept, and it and every smaller bucket are skipped: the device has no room left, and trying each
   would only fail again, slowly.
4. On a tensor-parallel rank every decision above (capture this bucket, release the largest graph, drop a capture
   that ran out of memory) is shared through ``agree`` before it is acted on, so every rank keeps the same buckets
   (``cudagraph.runner.agreement``).

What it does not do: choose buckets (``plan_capture`` did), or read memory anywhere but through the backend.
"""

from __future__ import annotations

import gc
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from cudagraph.backend import BaseCudaGraphBackend, CompileStats
from cudagraph.backend_utils import exception_chain, freeze_gc, is_out_of_memory

from .agreement import (
    ANOTHER_RANK_HAS_NO_ROOM,
    ANOTHER_RANK_RAN_OUT,
    ANOTHER_RANK_RELEASED,
    Agree,
    everywhere,
    one_rank,
)
from .memory_plan import OUT_OF_MEMORY_WHILE_CAPTURING, BudgetGuard, CaptureMemoryEstimate, CapturePlan
from .static_buckets import StaticBuckets
from .stats import BucketCaptureStats, CaptureStats

T = TypeVar("T")


def drop_failed_frames(error: BaseException) -> None:
    """Clear the local variables of every finished frame in ``error``'s tracebacks (its causes and contexts too:
    ``exception_chain``).

    An out-of-memory during a capture leaves the failed forward's frames in the traceback, holding its activations,
    its logits and the half-captured graph (whose pool then cannot be freed). Whoever still holds the error (a
    logger, a caller's ``except``) would keep them alive; cleared, they are freed with the next collection.
    """
    for link in exception_chain(error):
        traceback.clear_frames(link.__traceback__)


def out_of_memory_guarded(call: Callable[[], T]) -> tuple[T | None, bool]:
    """``(call(), False)``, or ``(None, True)`` when the device ran out of memory in it (its failure's frames
    cleared, so what they held goes with the next collection); any other error propagates."""
    try:
        return call(), False
    except Exception as error:
        if not is_out_of_memory(error):
            raise
        drop_failed_frames(error)
        return None, True


@dataclass
class CaptureLoop:
    """One run of the capture loop (see the module docstring) over a runner's ``StaticBuckets``: ``run()``, then read
    ``kept`` and ``skipped`` (or ``stats``).

    Each bucket is captured and released through ``buckets`` (``capture_timed``, ``release``); ``progress`` wraps
    the buckets in the progress bar; ``agree`` shares each decision with the other ranks of a tensor-parallel group
    (``one_rank`` alone).
    """

    buckets: StaticBuckets
    plan: CapturePlan
    estimate: CaptureMemoryEstimate | None
    free_at_start: int
    progress: Callable[[list[int]], Iterable[int]]
    kept: dict[int, BucketCaptureStats] = field(default_factory=dict)
    """Captured buckets that hold graphs, by bucket."""
    skipped: dict[int, str] = field(default_factory=dict)
    """Planned or captured buckets left without a graph, each with why."""
    pool_held: bool = False
    """Whether this run's captures hold pool memory (from the first capture until the pool is renewed)."""
    agree: Agree = one_rank
    """The element-wise minimum of a few integers over every rank (see ``cudagraph.runner.agreement``)."""

    @property
    def backend(self) -> BaseCudaGraphBackend:
        """The backend the buckets are captured by."""
        return self.buckets.backend

    @property
    def guard(self) -> BudgetGuard | None:
        """The budget's guard (``None`` without a budget)."""
        return self._guard

    def __post_init__(self) -> None:
        self.skipped.update(self.plan.skipped)
        self._guard = self.plan.guard(self.estimate)

    def run(self) -> None:
        """Capture the plan's buckets, largest first, in one capture session with the garbage collector frozen."""
        buckets = sorted(self.plan.buckets, reverse=True)
        ran_out = False
        with freeze_gc(enable_gc=not self.backend.options.freeze_gc), self.backend.capture_session():
            for index, bucket in enumerate(self.progress(buckets)):
                if not self._capture_within_budget(bucket, first=index == 0):
                    ran_out = True
                    for smaller in buckets[index + 1 :]:
                        self.skipped[smaller] = f"not tried after CUDA ran out of memory capturing {bucket}"
                    break
        if ran_out:
            # The failed forward's frames (and the tensors they held) are garbage now; free them before measuring.
            gc.collect()
        if not self.kept:
            # No graph uses the pool (nor a pool a failed capture left behind): give its memory back now.
            self.backend.renew_pool()
            self.pool_held = False

    def _capture_within_budget(self, bucket: int, *, first: bool) -> bool:
        """Capture ``bucket`` under the budget's rule; False when the device ran out of memory capturing it (here or,
        on a tensor-parallel rank, on another rank). Every rank makes the same calls to ``agree`` in the same
        order, whether it has a budget or not."""
        guard = self._guard

        def no_room(used: int) -> bool:
            return guard is not None and not guard.fits(used, bucket, pool_held=self.pool_held)

        used_before = self._release_while(no_room)
        fits_here = not no_room(used_before)
        if not everywhere(self.agree, fits_here):
            self.skipped[bucket] = (
                guard.skip_reason(used_before, bucket, pool_held=self.pool_held)
                if guard is not None and not fits_here
                else ANOTHER_RANK_HAS_NO_ROOM
            )
            return True
        estimated = guard.estimated_need(bucket, pool_held=self.pool_held) if guard is not None else 0
        ran_out = False
        try:
            self.kept[bucket] = self.buckets.capture_timed(bucket, first)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            drop_failed_frames(error)
            ran_out = True
        if not everywhere(self.agree, not ran_out):
            if not ran_out:
                # Captured here, not on another rank: no rank may replay it.
                self.buckets.release(bucket)
                del self.kept[bucket]
            self.skipped[bucket] = OUT_OF_MEMORY_WHILE_CAPTURING if ran_out else ANOTHER_RANK_RAN_OUT
            return False
        self.pool_held = True
        if guard is not None:
            guard.observe(estimated, self._used_bytes() - used_before)
        self._release_while(lambda used: guard is not None and used > guard.limit_bytes)
        return True

    def _used_bytes(self) -> int:
        """Device memory this capture has taken so far (a settled reading)."""
        return self.free_at_start - self.backend.memory_reading().free_bytes

    def _release_while(self, over: Callable[[int], bool]) -> int:
        """Release the largest graph held (then the pool) while ``over(used bytes)`` on any rank; return the bytes
        used after. Every rank releases the same graphs: it holds the same ones, and acts on the shared answer."""
        guard = self._guard
        used = self._used_bytes() if guard is not None else 0  # without a budget nothing here reads memory
        while not everywhere(self.agree, not over(used)):
            reason = guard.release_reason(used) if guard is not None and over(used) else ANOTHER_RANK_RELEASED
            if self.kept:
                largest = max(self.kept)
                self.buckets.release(largest)
                del self.kept[largest]
                self.skipped[largest] = reason
            elif self.pool_held:
                self.backend.renew_pool()
                self.pool_held = False
            else:
                break
            used = self._used_bytes() if guard is not None else 0
        return used

    def captured_stats(self) -> tuple[BucketCaptureStats, ...]:
        """What each kept bucket cost, in capture order (largest first)."""
        return tuple(self.kept[bucket] for bucket in sorted(self.kept, reverse=True))

    def stats(
        self,
        started: float,
        free_at_start: int,
        estimate: CaptureMemoryEstimate | None,
        compile_stats: CompileStats | None,
    ) -> CaptureStats:
        """What the run cost, from ``started`` (``time.perf_counter()`` before the backend was prepared) and the free
        device memory before it: per bucket, in total, compiling, and against the estimate."""
        return CaptureStats(
            per_bucket=self.captured_stats(),
            seconds=time.perf_counter() - started,
            bytes=max(0, free_at_start - self.backend.memory_reading().free_bytes),
            compile_seconds=compile_stats.compile_seconds if compile_stats is not None else 0.0,
            compilations=compile_stats.compilations if compile_stats is not None else 0,
            estimate_bytes=(
                estimate.total_bytes_for(self.plan.buckets) if estimate is not None and estimate.probes else None
            ),
            skipped=dict(sorted(self.skipped.items())),
        )
