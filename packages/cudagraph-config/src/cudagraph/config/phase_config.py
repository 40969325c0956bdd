"""``PhaseConfig``: the resolved settings of one phase, and the rule that picks the bucket a batch replays in.

Pure data plus that one rule; nothing here parses flags (see ``resolve``) or renders a whole config (see ``types``).
Never imports torch.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from .memory_budget import MemoryBudget
from .values import read_padding_ratio
from .vocabulary import DEFAULT_CAPTURE_POLICY, Backend, CapturePolicy

PHASE_FIELDS: tuple[str, ...] = (
    "backend",
    "buckets",
    "max_size",
    "max_padding_ratio",
    "memory_budget",
    "capture_policy",
)
"""The fields of a ``PhaseConfig``, in display order; ``<phase>.<field>`` is each one's key in ``sources``."""


def smallest_bucket_holding(buckets: Sequence[int], size: int) -> int | None:
    """The smallest of ``buckets`` (ascending) that holds a batch of ``size``, or ``None`` when ``size`` exceeds
    them all: the padding rule, here for ``PhaseConfig.bucket_for`` and the runners alike.

    Example:
        >>> smallest_bucket_holding((1, 2, 4, 8), 3), smallest_bucket_holding((1, 2, 4, 8), 9)
        (4, None)
    """
    index = bisect.bisect_left(buckets, size)
    return buckets[index] if index < len(buckets) else None


def exceeds_padding_ratio(size: int, bucket: int, max_padding_ratio: float | None) -> bool:
    """Whether padding a batch of ``size`` up to ``bucket`` pads more than ``max_padding_ratio`` allows: the bucket is
    more than the ratio times the size (``None``: no limit).

    Example:
        >>> exceeds_padding_ratio(5, 8, 1.5), exceeds_padding_ratio(6, 9, 1.5), exceeds_padding_ratio(5, 8, None)
        (True, False, False)
    """
    return max_padding_ratio is not None and bucket > max_padding_ratio * size


@dataclass(frozen=True)
class PhaseConfig:
    """The resolved settings of one phase: its backend and the shapes (batch sizes or token counts) to capture."""

    backend: Backend
    buckets: tuple[int, ...]
    """Ascending, deduplicated shapes to capture; empty when the backend is ``disabled``. From ``resolve`` the last
    one is always ``max_size``."""
    max_size: int
    """The largest shape this phase is sized for, and its last bucket (``resolve`` appends it to an explicit bucket
    list that stops below it); 0 when the backend is ``disabled``."""
    max_padding_ratio: float | None = None
    """A batch whose bucket is more than this multiple of its real size runs eagerly (``None``: any padding
    replays); at least 1. ``None`` when the backend is ``disabled``."""
    memory_budget: MemoryBudget | None = None
    """The most device memory this phase's graphs may take; capture stops before exceeding it (``None``: no cap).
    ``None`` when the backend is ``disabled``."""
    capture_policy: CapturePolicy = DEFAULT_CAPTURE_POLICY
    """When the phase's graphs are captured: every bucket at start-up (``eager``), or each bucket by the first step
    routed to it (``lazy``). ``eager`` when the backend is ``disabled``."""

    def __post_init__(self) -> None:
        # The one check of a ratio built in Python (``resolve`` reads flags and JSON by the same rule): the layers
        # above trust it.
        if self.max_padding_ratio is not None:
            ratio = read_padding_ratio("max_padding_ratio", self.max_padding_ratio, allow_infinity=True)
            object.__setattr__(self, "max_padding_ratio", ratio)

    @property
    def enabled(self) -> bool:
        """Whether this phase replays graphs at all."""
        return self.backend is not Backend.DISABLED

    def bucket_for(self, size: int) -> int | None:
        """The bucket a batch of ``size`` replays in: the smallest bucket at least ``size``; ``None`` (run eagerly)
        when the phase is disabled, ``size`` is not positive or above the last bucket, or that bucket is more than
        ``max_padding_ratio`` times ``size``. (``CudaGraphConfig.disable_padding`` is the engine-wide switch that
        also sends every size that is not a bucket eagerly; it is not a field of a phase.)

        Example:
            >>> config = PhaseConfig(Backend.FULL, (1, 2, 4, 8), 8, max_padding_ratio=1.5)
            >>> [config.bucket_for(size) for size in (1, 3, 5, 6, 9)]
            [1, 4, None, 8, None]
        """
        if not self.enabled or size < 1:
            return None
        bucket = smallest_bucket_holding(self.buckets, size)
        if bucket is None:
            return None
        return None if exceeds_padding_ratio(size, bucket, self.max_padding_ratio) else bucket
