"""Buckets and padding choices, without any model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runner_helpers import StubModelRunner

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
from cudagraph.runner import DecodeCudaGraphRunner, get_batch_sizes_to_capture, pad_to_bucket


@given(st.lists(st.integers(1, 512), min_size=1, max_size=20, unique=True), st.integers(0, 600))
def test_pad_to_bucket_is_the_smallest_bucket_that_holds_the_size(buckets: list[int], size: int) -> None:
    buckets = sorted(buckets)
    chosen = pad_to_bucket(buckets, size)
    holding = [b for b in buckets if b >= size]
    assert chosen == (min(holding) if holding else None)


@pytest.mark.parametrize(("size", "expected"), [(1, 1), (3, 4), (4, 4), (5, 8), (8, 8), (9, None)])
def test_pad_to_bucket_examples(size: int, expected: int | None) -> None:
    assert pad_to_bucket((1, 2, 4, 8), size) == expected


def test_batch_sizes_to_capture_follow_the_decode_config() -> None:
    config = CudaGraphConfig(
        decode=PhaseConfig(Backend.FULL, (1, 2, 4, 8, 16), 16), prefill=PhaseConfig(Backend.DISABLED, (), 0)
    )
    assert get_batch_sizes_to_capture(config) == [1, 2, 4, 8, 16]
    disabled = CudaGraphConfig(decode=PhaseConfig(Backend.DISABLED, (), 0), prefill=config.prefill)
    assert get_batch_sizes_to_capture(disabled) == []


@pytest.mark.parametrize("query_len", [1, 3])
def test_a_bucket_slices_its_output_only_for_the_sizes_that_pad_to_it(query_len: int) -> None:
    """``output_rows`` of a bucket holds a view per size that replays it (0, an idle batch, with the smallest), and
    none for the sizes of other buckets: a replay never reads a view made for another bucket's rows."""
    config = CudaGraphConfig(
        decode=PhaseConfig(Backend.FULL, (1, 2, 4, 8), 8), prefill=PhaseConfig(Backend.DISABLED, (), 0)
    )
    runner = DecodeCudaGraphRunner(
        StubModelRunner(), config, backend=CpuReplayBackend(Backend.FULL), show_progress=False, query_len=query_len
    )
    runner.capture()
    rows = {bucket: sorted(static.output_rows) for bucket, static in runner.static_buckets.items()}
    sizes = {1: [0, 1], 2: [2], 4: [3, 4], 8: [5, 6, 7, 8]}
    assert rows == {bucket: [size * query_len for size in of_bucket] for bucket, of_bucket in sizes.items()}
