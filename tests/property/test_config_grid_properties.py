"""Properties of the bucket-grid account that ``--explain`` prints: its segments say exactly the buckets, its worst
padding is the true worst, and the sizes it says a padding ratio sends eagerly are exactly those
``PhaseConfig.bucket_for`` refuses."""

from __future__ import annotations

import itertools
import re

from hypothesis import example, given
from hypothesis import strategies as st

from cudagraph.config import Backend, Phase, PhaseConfig, default_buckets
from cudagraph.config.grid import GridSegment, eager_by_ratio, explain_grid, grid_segments

bucket_lists = st.one_of(
    st.lists(st.integers(1, 400), min_size=1, max_size=40, unique=True).map(lambda sizes: tuple(sorted(sizes))),
    st.builds(default_buckets, st.sampled_from(list(Phase)), st.integers(1, 3000)),
)
ratios = st.one_of(st.none(), st.floats(1, 20, allow_nan=False), st.sampled_from([1.0, 1.25, 1.5, 2.0]))


def _read_back(text: str, first_size: int) -> tuple[int, ...]:
    """The buckets a segment's description names, given the first size it takes."""
    if match := re.fullmatch(r"(\d+)\.\.(\d+)", text):
        return tuple(range(int(match[1]), int(match[2]) + 1))
    if match := re.fullmatch(r"every (\d+)(?: from (\d+))? to (\d+)", text):
        step, stop = int(match[1]), int(match[3])
        start = int(match[2]) if match[2] else (first_size + step - 1) // step * step
        return tuple(range(start, stop + 1, step))
    return tuple(int(item) for item in text.split(" "))


@given(bucket_lists)
@example((1, 2, 4, *range(8, 257, 8)))
@example((16, 24, 32, 40, 48))
def test_segments_say_exactly_the_buckets(buckets: tuple[int, ...]) -> None:
    segments = grid_segments(buckets)
    assert tuple(bucket for segment in segments for bucket in segment.buckets) == buckets
    first_size = 1
    for segment in segments:
        assert segment.first_size == first_size
        if segment.step is not None:
            assert len(segment.buckets) >= 3
            assert {b - a for a, b in itertools.pairwise(segment.buckets)} == {segment.step}
        if len(segment.buckets) <= 12:  # longer lists are abbreviated
            assert _read_back(segment.describe(), first_size) == segment.buckets
        first_size = segment.last_size + 1


def _brute_worst(segment: GridSegment, buckets: tuple[int, ...]) -> tuple[float, int, int]:
    config = PhaseConfig(Backend.FULL, buckets, buckets[-1])
    worst = (0.0, 0, 0)
    for size in range(segment.first_size, segment.last_size + 1):
        bucket = config.bucket_for(size)
        assert bucket is not None
        if bucket / size > worst[0]:
            worst = (bucket / size, size, bucket)
    return worst


@given(bucket_lists)
def test_worst_padding_is_the_worst_any_size_of_the_range_sees(buckets: tuple[int, ...]) -> None:
    for segment in grid_segments(buckets):
        assert segment.worst_padding() == _brute_worst(segment, buckets)


@given(bucket_lists, ratios)
@example((1, 2, 4, 8, 16, 24), 1.5)
@example((3,), 1.0)
@example((7, 10), 1.0 + 2**-52)
def test_sizes_sent_eagerly_by_a_ratio_are_exactly_those_without_a_bucket(
    buckets: tuple[int, ...], ratio: float | None
) -> None:
    config = PhaseConfig(Backend.FULL, buckets, buckets[-1], max_padding_ratio=ratio)
    ranges = eager_by_ratio(config)
    listed = [size for first, last in ranges for size in range(first, last + 1)]
    assert listed == [size for size in range(1, buckets[-1] + 1) if config.bucket_for(size) is None]
    # Ranges are ascending, disjoint and not adjacent (adjacent ones are merged).
    assert all(last + 1 < first for (_, last), (first, _) in itertools.pairwise(ranges))


@given(bucket_lists, ratios, st.booleans(), st.sampled_from(list(Phase)))
def test_the_account_names_the_count_the_largest_size_and_every_eager_size(
    buckets: tuple[int, ...], ratio: float | None, disable_padding: bool, phase: Phase
) -> None:
    config = PhaseConfig(Backend.BREAKABLE, buckets, buckets[-1], max_padding_ratio=ratio)
    rows = dict(explain_grid(phase, config, disable_padding=disable_padding))
    assert list(rows) == [f"{phase}.grid", f"{phase}.padding", f"{phase}.replays"]
    count = len(buckets)
    assert rows[f"{phase}.grid"].startswith(f"{count} bucket{'s' if count > 1 else ''}: ")
    replays = rows[f"{phase}.replays"]
    if disable_padding:
        assert replays.startswith(f"only the {count} bucket size")
        return
    assert f"above {buckets[-1]} run eagerly" in replays
    eager = sum(last - first + 1 for first, last in eager_by_ratio(config))
    assert (f"({eager} size" in replays) is (eager > 0)
    assert ("max_padding_ratio" in replays) is (ratio is not None)


def test_a_disabled_phase_has_no_account() -> None:
    assert explain_grid(Phase.DECODE, PhaseConfig(Backend.DISABLED, (), 0)) == ()
