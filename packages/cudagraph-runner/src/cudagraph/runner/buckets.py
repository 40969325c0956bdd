"""Bucket lists and padding: which captured shape a batch of a given size replays."""

from __future__ import annotations

from collections.abc import Sequence

from cudagraph.config import CudaGraphConfig
from cudagraph.config.phase_config import smallest_bucket_holding


def pad_to_bucket(buckets: Sequence[int], size: int) -> int | None:
    """The smallest bucket that holds ``size`` (``buckets`` ascending), or ``None`` when ``size`` exceeds them all
    (the config's one padding rule, ``smallest_bucket_holding``)."""
    return smallest_bucket_holding(buckets, size)


def get_batch_sizes_to_capture(config: CudaGraphConfig) -> list[int]:
    """The decode batch sizes ``config`` captures, ascending (empty when decode graphs are disabled)."""
    return list(config.decode.buckets) if config.decode.enabled else []
