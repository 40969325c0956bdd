"""A short account of one phase's bucket grid, for ``--explain``: the schedule's segments, how far a batch of each size
range is padded at worst, and which sizes replay.

A pure function of a ``PhaseConfig`` (plus the two facts it cannot hold: whether ``resolve`` appended the max to the
given buckets, and the engine-wide ``disable_padding`` switch). It reads the buckets as they are, whether they came
from the default schedule or a user's list, and never changes a config.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .phase_config import PhaseConfig, exceeds_padding_ratio
from .vocabulary import Phase, phase_key

MAX_APPENDED_NOTE = "appended as the last bucket"
"""Ends the ``<phase>.buckets`` source note of a max that ``resolve`` appended to an explicit bucket list."""

_RUN_MIN_LENGTH = 3
"""Buckets in one arithmetic run before it is written ``every <step> to <stop>`` rather than listed."""
_LIST_LIMIT = 12
_RANGE_LIMIT = 8


@dataclass(frozen=True)
class GridSegment:
    """Consecutive buckets described together: an arithmetic run (``step`` set) or buckets listed one by one.

    ``first_size`` is the smallest batch size the segment's buckets take: one above the previous segment's last bucket
    (1 for the first segment), since a batch pads up to the next bucket.
    """

    buckets: tuple[int, ...]
    step: int | None
    first_size: int

    @property
    def last_size(self) -> int:
        """The largest batch size the segment's buckets take: its last bucket."""
        return self.buckets[-1]

    def describe(self) -> str:
        """``1 2 4``, ``every 8 to 256`` (every multiple of 8 after the previous segment), ``every 8 from 16 to 64``,
        or ``9..16`` (a run of step 1)."""
        if self.step is None:
            return _abbreviated([str(bucket) for bucket in self.buckets], _LIST_LIMIT, " ")
        start, stop = self.buckets[0], self.buckets[-1]
        if self.step == 1:
            return f"{start}..{stop}"
        first_multiple = (self.first_size + self.step - 1) // self.step * self.step
        where = "" if start == first_multiple else f" from {start}"
        return f"every {self.step}{where} to {stop}"

    def worst_padding(self) -> tuple[float, int, int]:
        """``(ratio, size, bucket)``: the largest bucket / size over the sizes this segment takes; the smallest such
        size on a tie. A batch of the size one above the previous bucket pads the most."""
        worst = (0.0, 0, 0)
        previous = self.first_size - 1
        for bucket in self.buckets:
            ratio = bucket / (previous + 1)
            if ratio > worst[0]:
                worst = (ratio, previous + 1, bucket)
            previous = bucket
        return worst


def grid_segments(buckets: Sequence[int]) -> tuple[GridSegment, ...]:
    """``buckets`` (ascending) as runs of at least three buckets with one step, and lists of the buckets between.

    Example:
        >>> [segment.describe() for segment in grid_segments((1, 2, 4, 8, 16, 24, 32, 48, 64))]
        ['1 2 4', 'every 8 to 32', '48 64']
    """
    segments: list[GridSegment] = []
    listed: list[int] = []
    first_size = 1

    def close_list() -> None:
        nonlocal first_size
        if listed:
            segments.append(GridSegment(tuple(listed), None, first_size))
            first_size = listed[-1] + 1
            listed.clear()

    index = 0
    while index < len(buckets):
        end = index + 1
        step = buckets[end] - buckets[index] if end < len(buckets) else 0
        while end < len(buckets) and buckets[end] - buckets[end - 1] == step:
            end += 1
        if end - index >= _RUN_MIN_LENGTH:
            close_list()
            segments.append(GridSegment(tuple(buckets[index:end]), step, first_size))
            first_size = buckets[end - 1] + 1
            index = end
        else:
            listed.append(buckets[index])
            index += 1
    close_list()
    return tuple(segments)


def eager_by_ratio(config: PhaseConfig) -> tuple[tuple[int, int], ...]:
    """The sizes up to the last bucket that ``config.max_padding_ratio`` sends eagerly, as inclusive ranges.

    Example:
        >>> from cudagraph.config import Backend
        >>> eager_by_ratio(PhaseConfig(Backend.FULL, (1, 2, 4, 8, 16, 24), 24, max_padding_ratio=1.5))
        ((5, 5), (9, 10))
    """
    ranges: list[tuple[int, int]] = []
    ratio = config.max_padding_ratio
    if ratio is None:
        return ()
    previous = 0
    for bucket in config.buckets:
        # Sizes n of (previous, bucket] with bucket > ratio * n: n below bucket / ratio, settled by the rule itself
        # so that float rounding cannot make this account disagree with ``PhaseConfig.bucket_for``.
        last = max(previous, min(bucket, math.ceil(bucket / ratio)))
        while last > previous and not exceeds_padding_ratio(last, bucket, ratio):
            last -= 1
        while last < bucket and exceeds_padding_ratio(last + 1, bucket, ratio):
            last += 1
        if last > previous:
            if ranges and ranges[-1][1] == previous:
                ranges[-1] = (ranges[-1][0], last)
            else:
                ranges.append((previous + 1, last))
        previous = bucket
    return tuple(ranges)


def explain_grid(
    phase: Phase, config: PhaseConfig, *, max_appended: bool = False, disable_padding: bool = False
) -> tuple[tuple[str, str], ...]:
    """``(key, text)`` rows that explain the grid of an enabled phase: ``<phase>.grid`` (the segments and the count),
    ``<phase>.padding`` (the worst padding per segment's size range, or none with ``disable_padding``) and
    ``<phase>.replays`` (which sizes replay and which run eagerly, by size, by ``max_padding_ratio`` or by
    ``disable_padding``). None for a disabled phase.

    Example:
        >>> from cudagraph.config import Backend
        >>> for key, text in explain_grid(Phase.DECODE, PhaseConfig(Backend.FULL, (1, 2, 4, 8, 16, 24, 32), 32)):
        ...     print(key, "|", text)
        decode.grid | 7 buckets: 1 2 4, then every 8 to 32
        decode.padding | sizes 1..4 worst 1.33x at 3 -> 4; 5..32 worst 1.78x at 9 -> 16
        decode.replays | sizes 1..32 pad up to the next bucket; above 32 run eagerly
    """
    if not config.enabled:
        return ()
    key = phase_key(phase, "grid")
    buckets = config.buckets
    if not buckets:
        return ((key, "no buckets: every size runs eagerly"),)
    segments = grid_segments(buckets)
    grid = f"{_count(len(buckets), 'bucket')}: " + ", then ".join(segment.describe() for segment in segments)
    if max_appended:
        grid += f" (the max {config.max_size} {MAX_APPENDED_NOTE})"
    if disable_padding:
        padding = "none: padding is disabled"
    else:
        padding = "sizes " + "; ".join(_segment_padding(segment) for segment in segments)
    return (
        (key, grid),
        (phase_key(phase, "padding"), padding),
        (phase_key(phase, "replays"), _replays(config, disable_padding)),
    )


def _segment_padding(segment: GridSegment) -> str:
    sizes = _range_text(segment.first_size, segment.last_size)
    ratio, size, bucket = segment.worst_padding()
    if size == bucket:
        return f"{sizes} no padding"
    return f"{sizes} worst {ratio:.3g}x at {size} -> {bucket}"


def _replays(config: PhaseConfig, disable_padding: bool) -> str:
    largest = config.buckets[-1]
    if disable_padding:
        return f"only the {_count(len(config.buckets), 'bucket size')} (padding disabled); other sizes run eagerly"
    text = f"sizes {_range_text(1, largest)} pad up to the next bucket; above {largest} run eagerly"
    if config.max_padding_ratio is None:
        return text
    ranges = eager_by_ratio(config)
    ratio = f"max_padding_ratio {config.max_padding_ratio:g}"
    if not ranges:
        return f"{text}; {ratio} sends no size eagerly"
    shown = _abbreviated([_range_text(first, last) for first, last in ranges], _RANGE_LIMIT, ", ")
    count = sum(last - first + 1 for first, last in ranges)
    return f"{text}; {ratio} sends {shown} eagerly ({_count(count, 'size')})"


def _range_text(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}..{last}"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _abbreviated(items: list[str], limit: int, separator: str) -> str:
    if len(items) > limit:
        items = [*items[: limit // 2], "...", *items[-(limit // 4) :]]
    return separator.join(items)
