"""Buckets and padding choices, without any model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
from cudagraph.runner import get_batch_sizes_to_capture, pad_to_bucket


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
