"""Default bucket schedules (decode batch sizes, prefill token counts) and the default largest size per phase.

A schedule is a table: a few leading sizes, then arithmetic segments whose step grows with the size, because padding
a large batch by a few rows costs relatively less than padding a small one. ``default_buckets`` cuts a schedule at
the max and caps it there, so the max itself is always the last bucket.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from .environment import Environment
from .values import read_phase
from .vocabulary import DEFAULT_MAX_SIZE, ConfigError, Phase


@dataclass(frozen=True)
class Segment:
    """Sizes ``start, start + step, ...`` up to ``stop`` inclusive (``None``: without end)."""

    start: int
    step: int
    stop: int | None = None


@dataclass(frozen=True)
class BucketSchedule:
    """The sizes a phase captures by default, ascending and without end."""

    leading: tuple[int, ...]
    segments: tuple[Segment, ...]

    def sizes(self) -> Iterator[int]:
        """Every size of the schedule, ascending (infinite: the last segment has no end)."""
        yield from self.leading
        for segment in self.segments:
            stop = None if segment.stop is None else segment.stop + 1
            yield from (
                itertools.count(segment.start, segment.step)
                if stop is None
                else range(segment.start, stop, segment.step)
            )


BUCKET_SCHEDULES: dict[Phase, BucketSchedule] = {
    # [1, 2, 4] + 8..256 step 8 + 272.. step 16
    Phase.DECODE: BucketSchedule((1, 2, 4), (Segment(8, 8, 256), Segment(272, 16))),
    # 16..256 step 16 + 320..1024 step 64 + 1280.. step 256: 32 buckets up to the default 2048 tokens
    Phase.PREFILL: BucketSchedule((), (Segment(16, 16, 256), Segment(320, 64, 1024), Segment(1280, 256))),
}

DECODE_MAX_BS_BY_GPU_MEMORY: tuple[tuple[float, int], ...] = ((20, 32), (40, 128), (90, 256), (float("inf"), 512))
"""``(GPU memory below this many GiB, default largest decode batch)``: smaller GPUs hold fewer graphs' buffers."""


def default_max_size(phase: Phase, environment: Environment) -> tuple[int, str]:
    """The default largest shape of ``phase`` and why: decode follows the GPU memory when the environment gives it."""
    if phase is Phase.DECODE and environment.gpu_memory_gib is not None:
        for below_gib, max_batch in DECODE_MAX_BS_BY_GPU_MEMORY:
            if environment.gpu_memory_gib < below_gib:
                return max_batch, f"for {environment.gpu_memory_gib:g} GiB of GPU memory"
    return DEFAULT_MAX_SIZE[phase], ""


def default_buckets(phase: Phase | str, max_size: int) -> tuple[int, ...]:
    """The default shapes of ``phase`` up to ``max_size``: the phase's schedule cut and capped at ``max_size``.

    Example:
        >>> default_buckets("decode", 20)
        (1, 2, 4, 8, 16, 20)
        >>> default_buckets("prefill", 64)
        (16, 32, 48, 64)
    """
    phase = read_phase("phase", phase)
    if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size <= 0:
        raise ConfigError(f"max_size: {max_size!r} is not allowed; allowed: positive integers")
    below = itertools.takewhile(lambda size: size < max_size, BUCKET_SCHEDULES[phase].sizes())
    return (*below, max_size)
