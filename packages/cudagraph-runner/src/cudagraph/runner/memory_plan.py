"""Graph memory known before capture, and kept within a budget during it: what a runner's graphs will take, and
which buckets a memory budget lets it capture.

Measured, not modelled. A runner captures a few *probe* buckets into a scratch pool that is freed afterwards (the
largest bucket first, then up to three smaller ones spread over the rest), reading the device memory around each
(``ProbeCapture``), and ``estimate_from_probes`` turns those readings into a ``CaptureMemoryEstimate``:

- the *pool*: what capturing the largest bucket took, less its own graph cost. Buckets are captured largest first
  into one shared pool, so every smaller graph reuses the blocks the largest forward's activations needed; the
  reading includes the allocator's segment rounding, which no shape-times-dtype sum would;
- each bucket's *graph cost*: what one more graph adds once the pool exists (the instantiated graph, which the
  allocator never sees, plus what the pool must grow for the tensors it keeps). A least-squares line in the bucket
  size through the drops in free device memory of the smaller probes (fitted over several, because the driver hands
  memory out in 2 MiB pages, so one graph reads as 0 or 2 MiB);
- each bucket's *activations*: the peak live bytes of its forward (warm-ups and capture), interpolated between the
  probes. They scale the pool when a budget leaves the largest buckets out.

``plan_capture`` turns an estimate and a ``MemoryBudget`` into the buckets to capture (a prefix of the ascending
buckets: the largest are dropped until the estimate fits), and ``BudgetGuard`` keeps the running capture within the
budget by what it measures. This module computes; it never touches a device.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from cudagraph.config import MemoryBudget

from .stats import warn_renamed_field

__all__ = [
    "BudgetGuard",
    "CaptureMemoryEstimate",
    "CapturePlan",
    "ProbeCapture",
    "budget_text",
    "estimate_from_probes",
    "format_bytes",
    "plan_capture",
    "probe_buckets",
    "skipped_summary",
]

MAX_SMALLER_PROBES = 3
"""Probes besides the largest bucket: enough to average the driver's 2 MiB pages and fit a slope, few enough that
estimating costs a fraction of the capture it predicts."""

OUT_OF_MEMORY_WHILE_ESTIMATING = "CUDA out of memory while estimating"
OUT_OF_MEMORY_WHILE_CAPTURING = "CUDA out of memory while capturing"


def format_bytes(count: int) -> str:
    """``count`` bytes for a log line, to three significant digits: ``"1.8GiB"``, ``"44MiB"``, ``"0.5MiB"``."""
    if abs(count) >= 2**30:
        return f"{count / 2**30:.3g}GiB"
    return f"{count / 2**20:.3g}MiB"


@dataclass(frozen=True)
class ProbeCapture:
    """What capturing one probe bucket took, read around its capture (earlier probes still held in the same pool)."""

    bucket: int
    bytes: int
    """Drop in free device memory (driver-visible: pool segments, instantiated graphs, kept buffers)."""
    peak_bytes: int
    """Peak live bytes above the reading before it, over its warm-ups and capture: its forward's activations."""
    kept_bytes: int
    """Change in the bytes live in the allocator across it: what its graph keeps (its output is held weakly, so it
    does not count), less whatever an earlier probe kept that this one freed (so it may be negative)."""

    @property
    def shape(self) -> int:
        """Deprecated name of ``bucket`` (removed in 1.0.0)."""
        warn_renamed_field("ProbeCapture", "shape", "bucket")
        return self.bucket


def probe_buckets(buckets: Sequence[int], max_smaller: int = MAX_SMALLER_PROBES) -> tuple[int, ...]:
    """The buckets to probe, in capture order: the largest bucket, then up to ``max_smaller`` others, spread evenly
    over the rest from the smallest up (descending, as a capture runs).

    Example:
        >>> probe_buckets([1, 2, 4, 8, 16, 32, 64])
        (64, 16, 4, 1)
        >>> probe_buckets([8, 16])
        (16, 8)
    """
    ordered = sorted(set(buckets))
    if not ordered:
        return ()
    rest = ordered[:-1]
    count = min(max_smaller, len(rest))
    picked = sorted({rest[(index * len(rest)) // count] for index in range(count)}) if count else []
    return (ordered[-1], *reversed(picked))


def _interpolate(points: Mapping[int, float], x: int) -> float:
    """Piecewise-linear through ``points`` (extended by the end segments); through the origin for one point."""
    xs = sorted(points)
    if len(xs) == 1:
        only = xs[0]
        return points[only] * x / only if only else points[only]
    segments = list(itertools.pairwise(xs))
    left, right = next(((left, right) for left, right in segments if x <= right), segments[-1])
    return points[left] + (points[right] - points[left]) / (right - left) * (x - left)


def _slope(points: Sequence[tuple[int, int]]) -> float:
    """Least-squares slope of ``points`` (0 with fewer than two distinct x)."""
    if len({x for x, _ in points}) < 2:
        return 0.0
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    numerator = sum((x - mean_x) * (y - mean_y) for x, y in points)
    denominator = sum((x - mean_x) ** 2 for x, _ in points)
    return numerator / denominator


@dataclass(frozen=True)
class _GraphCostLine:
    """A graph's cost as a line in its bucket size: ``level`` at ``centre``, rising ``slope`` bytes per row."""

    level: float = 0.0
    centre: float = 0.0
    slope: float = 0.0

    @classmethod
    def fit(cls, probes: Sequence[ProbeCapture]) -> _GraphCostLine:
        """The least-squares line through the smaller probes' free-memory drops (``probes[1:]``): what one more
        graph takes once the pool exists. With fewer than two smaller sizes to fit, the slope is read from the
        bytes every probe's graph keeps (the largest's included).

        Not from the kept bytes when the drops can say it: what a graph keeps lives in the pool, and a smaller
        graph's kept tensors mostly reuse blocks the largest forward freed (a breakable graph keeps the tensors that
        cross its eager breaks: tens of MiB at the largest bucket that cost a later graph next to nothing).
        """
        smaller = probes[1:]
        if not smaller:
            return cls()
        level = sum(probe.bytes for probe in smaller) / len(smaller)
        centre = sum(probe.bucket for probe in smaller) / len(smaller)
        if len({probe.bucket for probe in smaller}) >= 2:
            points = [(probe.bucket, probe.bytes) for probe in smaller]
        else:
            points = [(probe.bucket, probe.kept_bytes) for probe in probes]
        # A graph never costs less for more rows: a falling fit is read as flat.
        return cls(level, centre, max(0.0, _slope(points)))

    def __call__(self, bucket: int) -> int:
        return max(0, round(self.level + self.slope * (bucket - self.centre)))


@dataclass(frozen=True)
class CaptureMemoryEstimate:
    """What capturing a runner's buckets will take from the free device memory, known before capturing them.

    ``total_bytes`` = ``pool_bytes`` + the sum of ``graph_bytes``; ``total_bytes_for(buckets)`` is the same for a
    subset (the pool scaled to the largest bucket kept). The estimate is for a pool of the runner's own: captured
    into a pool another runner already grew, a capture reuses its free blocks and takes less. Made by
    ``BaseCudaGraphRunner.estimate_capture_memory()``; see the module docstring for how.
    """

    buckets: tuple[int, ...] = ()
    """The buckets estimated, ascending (all the runner's buckets but those that ran out of memory while probing)."""
    pool_bytes: int = 0
    """The shared pool the largest estimated bucket's capture grows (its forward's activations, in segments)."""
    graph_bytes: Mapping[int, int] = field(default_factory=dict)
    """Per bucket: what its graph adds beyond the pool."""
    activation_bytes: Mapping[int, int] = field(default_factory=dict)
    """Per bucket: its forward's peak live bytes (the pool it would need as the largest captured)."""
    probes: tuple[ProbeCapture, ...] = ()
    """The measurements it was made from, in capture order."""
    out_of_memory: tuple[int, ...] = ()
    """Buckets whose probe ran out of device memory: too large to capture now, so not estimated."""
    seconds: float = 0.0
    """Wall time the probes took."""
    note: str = ""
    """Why nothing was measured (empty when the probes ran)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "graph_bytes", MappingProxyType(dict(self.graph_bytes)))
        object.__setattr__(self, "activation_bytes", MappingProxyType(dict(self.activation_bytes)))

    @property
    def largest(self) -> int | None:
        """The largest estimated bucket (``None`` when nothing was)."""
        return self.buckets[-1] if self.buckets else None

    @property
    def total_bytes(self) -> int:
        """The pool plus every estimated bucket's graph."""
        return self.total_bytes_for(self.buckets)

    @property
    def per_bucket_bytes(self) -> dict[int, int]:
        """What capturing each bucket adds, captured largest first: the largest carries the pool."""
        return {
            bucket: self.graph_bytes[bucket] + (self.pool_bytes if bucket == self.largest else 0)
            for bucket in self.buckets
        }

    def pool_bytes_for(self, largest: int) -> int:
        """The pool a capture whose largest bucket is ``largest`` grows: ``pool_bytes`` scaled by activations."""
        top = self.largest
        if top is None:
            return 0
        peak = self.activation_bytes.get(top, 0)
        if largest >= top or peak <= 0:
            return self.pool_bytes
        return round(self.pool_bytes * min(1.0, self.activation_bytes.get(largest, peak) / peak))

    def total_bytes_for(self, buckets: Iterable[int]) -> int:
        """What capturing ``buckets`` (those estimated) takes: their largest one's pool plus their graphs."""
        chosen = [bucket for bucket in buckets if bucket in self.graph_bytes]
        if not chosen:
            return 0
        return self.pool_bytes_for(max(chosen)) + sum(self.graph_bytes[bucket] for bucket in chosen)

    def __str__(self) -> str:
        if not self.probes:
            return f"graph memory not estimated: {self.note or 'nothing was measured'}"
        graphs = len(self.buckets)
        mean_graph = sum(self.graph_bytes.values()) // graphs if graphs else 0
        measured = ", ".join(str(probe.bucket) for probe in self.probes)
        text = (
            f"{format_bytes(self.total_bytes)} for {graphs} graphs: a {format_bytes(self.pool_bytes)} pool "
            f"(largest {self.largest}) + {format_bytes(mean_graph)} per graph (probes {measured}, "
            f"{self.seconds:.2f} s)"
        )
        if self.out_of_memory:
            text += f"; {', '.join(map(str, self.out_of_memory))} ran out of memory"
        return text


def estimate_from_probes(
    buckets: Sequence[int],
    probes: Sequence[ProbeCapture],
    *,
    out_of_memory: Iterable[int] = (),
    seconds: float = 0.0,
    note: str = "",
) -> CaptureMemoryEstimate:
    """The estimate for ``buckets`` from ``probes`` (in capture order: the first is the largest bucket that fit;
    see the module docstring). ``out_of_memory``: buckets whose probe ran out of memory (not estimated)."""
    failed = tuple(sorted(set(out_of_memory)))
    if not probes:
        return CaptureMemoryEstimate(out_of_memory=failed, seconds=seconds, note=note or "no probe was captured")
    largest = probes[0]
    estimated = tuple(bucket for bucket in sorted(set(buckets)) if bucket <= largest.bucket and bucket not in failed)
    graph_cost = _GraphCostLine.fit(probes)
    peaks: dict[int, float] = {probe.bucket: float(probe.peak_bytes) for probe in probes}
    return CaptureMemoryEstimate(
        buckets=estimated,
        pool_bytes=max(0, largest.bytes - graph_cost(largest.bucket)),
        graph_bytes={bucket: graph_cost(bucket) for bucket in estimated},
        activation_bytes={bucket: max(0, round(_interpolate(peaks, bucket))) for bucket in estimated},
        probes=tuple(probes),
        out_of_memory=failed,
        seconds=seconds,
        note=note,
    )


def budget_text(budget: MemoryBudget, limit_bytes: int) -> str:
    """``budget`` as a reason names it: ``"1.5GiB"``, or ``"20% (= 1.2GiB)"`` for a share of free memory."""
    if budget.bytes is not None:
        return str(budget)
    return f"{budget} (= {format_bytes(limit_bytes)})"


@dataclass(frozen=True)
class CapturePlan:
    """The buckets a capture will try (ascending) and those it leaves out before starting, each with why."""

    buckets: tuple[int, ...]
    skipped: Mapping[int, str] = field(default_factory=dict)
    limit_bytes: int | None = None
    """The budget in bytes (``None``: no budget)."""
    budget: MemoryBudget | None = None

    def guard(self, estimate: CaptureMemoryEstimate | None) -> BudgetGuard | None:
        """The rule that keeps a capture of this plan within its budget (``None`` without a budget)."""
        if self.budget is None or self.limit_bytes is None:
            return None
        return BudgetGuard(self.limit_bytes, self.budget, estimate)


def plan_capture(
    buckets: Sequence[int],
    estimate: CaptureMemoryEstimate | None,
    budget: MemoryBudget | None,
    free_bytes: int,
) -> CapturePlan:
    """The buckets to capture under ``budget`` (given the free memory when capture starts, which also caps the
    budget): a prefix of the ascending ``buckets``, the largest dropped one by one until ``estimate`` says the rest
    fit.

    Buckets whose probe ran out of memory are left out first. Without a budget every other bucket is tried;
    without an estimate the budget is left to ``BudgetGuard`` alone.
    """
    ordered = sorted(set(buckets))
    skipped: dict[int, str] = {}
    failed = set(estimate.out_of_memory) if estimate is not None else set()
    for bucket in ordered:
        if bucket in failed:
            skipped[bucket] = OUT_OF_MEMORY_WHILE_ESTIMATING
    candidates = [bucket for bucket in ordered if bucket not in failed]
    if budget is None:
        return CapturePlan(tuple(candidates), skipped)
    # A budget above what is free would only be met by running out of memory: the free memory caps it.
    limit = min(budget.limit_bytes(free_bytes), free_bytes) if free_bytes > 0 else budget.limit_bytes(free_bytes)
    if estimate is not None and estimate.probes:
        everything = estimate.total_bytes_for(candidates)
        reason = f"over the {budget_text(budget, limit)} budget (estimate {format_bytes(everything)})"
        while candidates and estimate.total_bytes_for(candidates) > limit:
            skipped[candidates.pop()] = reason
    return CapturePlan(tuple(candidates), dict(sorted(skipped.items())), limit, budget)


@dataclass
class BudgetGuard:
    """Keeps a running capture within ``limit_bytes`` (device memory the capture may take from what was free when
    it started), by what it measures, since no estimate is exact.

    The rule, for buckets captured largest first into one pool that cannot shrink while it holds graphs:

    1. Before a bucket, its need is its graph cost, plus the pool its forward needs when the capture holds no pool
       yet, both from the estimate and multiplied by ``correction``: the largest ratio of measured to estimated
       growth seen so far in this capture, never below 1. Once the estimate has fallen short, every later bucket is
       assumed to fall short as much.
    2. While the memory used so far plus that need is over the limit, the runner releases the largest graph it
       holds (its graph cost comes back; small batches are the common ones, so the buckets kept stay a prefix);
       with none left it releases the pool too. If the bucket still does not fit, it is skipped.
    3. After a bucket, if the memory used is over the limit all the same, the runner releases the largest graphs
       (and then the pool) until it is not.
    """

    limit_bytes: int
    budget: MemoryBudget
    estimate: CaptureMemoryEstimate | None = None
    correction: float = 1.0

    @property
    def text(self) -> str:
        """The budget as reasons name it."""
        return budget_text(self.budget, self.limit_bytes)

    def estimated_need(self, bucket: int, *, pool_held: bool) -> int:
        """The estimate's bytes for capturing ``bucket`` next (rule 1, before ``correction``)."""
        estimate = self.estimate
        if estimate is None:
            return 0
        graph = estimate.graph_bytes.get(bucket, 0)
        return graph if pool_held else graph + estimate.pool_bytes_for(bucket)

    def need(self, bucket: int, *, pool_held: bool) -> int:
        """Rule 1: the bytes ``bucket`` is assumed to take."""
        return round(self.estimated_need(bucket, pool_held=pool_held) * self.correction)

    def fits(self, used_bytes: int, bucket: int, *, pool_held: bool) -> bool:
        """Whether ``bucket`` may be captured with ``used_bytes`` already taken."""
        return used_bytes + self.need(bucket, pool_held=pool_held) <= self.limit_bytes

    def observe(self, estimated_bytes: int, measured_bytes: int) -> None:
        """Raise ``correction`` when a bucket took more than estimated."""
        if estimated_bytes > 0 and measured_bytes > estimated_bytes:
            self.correction = max(self.correction, measured_bytes / estimated_bytes)

    def skip_reason(self, used_bytes: int, bucket: int, *, pool_held: bool) -> str:
        """Why ``bucket`` did not fit (rule 2)."""
        need = self.need(bucket, pool_held=pool_held)
        return f"over the {self.text} budget ({format_bytes(used_bytes)} used, {format_bytes(need)} more needed)"

    def release_reason(self, used_bytes: int) -> str:
        """Why a captured graph was released (rules 2 and 3)."""
        return f"over the {self.text} budget (released at {format_bytes(used_bytes)} used)"


def skipped_summary(skipped: Mapping[int, str]) -> str:
    """Skipped buckets grouped by reason, ascending: ``"48, 64: over the 1.5GiB budget (...); 32: ..."``."""
    by_reason: dict[str, list[int]] = {}
    for bucket in sorted(skipped):
        by_reason.setdefault(skipped[bucket], []).append(bucket)
    return "; ".join(f"{', '.join(map(str, buckets))}: {reason}" for reason, buckets in by_reason.items())
