"""Capture on first use at TP=2 on CPU (gloo): every rank captures the same bucket at the same step, and a bucket
one rank cannot capture stays eager on every rank."""

from __future__ import annotations

import pytest
import tp_lifecycle_workers

from cudagraph.engine.distributed import launch
from cudagraph.runner.agreement import ANOTHER_RANK_RAN_OUT
from cudagraph.runner.memory_plan import OUT_OF_MEMORY_WHILE_CAPTURING


@pytest.mark.slow  # deep: two gloo ranks capturing lazily
def test_a_bucket_one_rank_cannot_capture_stays_eager_on_every_rank() -> None:
    ranks = launch(tp_lifecycle_workers.lazy_capture_on_rank, ([[], [4]], True), 2)
    assert [rank["captured"] for rank in ranks] == [[1, 2, 8], [1, 2, 8]]
    assert ranks[0]["skipped"] == {4: ANOTHER_RANK_RAN_OUT}
    assert ranks[1]["skipped"] == {4: OUT_OF_MEMORY_WHILE_CAPTURING}
    assert all(all(rank["equal"]) for rank in ranks)
    assert [rank["lazy_captures"] for rank in ranks] == [4, 4]  # 4, 1, 8 and 2, each tried once
    # Deciding alone, rank 0 would keep a graph rank 1 has none of: steps of 3 would replay on one rank only.
    alone = launch(tp_lifecycle_workers.lazy_capture_on_rank, ([[], [4]], False), 2)
    assert alone[0]["captured"] != alone[1]["captured"]
