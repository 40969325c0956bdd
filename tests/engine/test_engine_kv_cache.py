"""The paged KV cache: scratch row and slot are never handed out; allocation round-trips."""

from __future__ import annotations

import pytest
import torch

from cudagraph.engine.kv_cache import CacheFullError, ReqToTokenPool, TokenToKVPool
from cudagraph.runner import PADDING_KV_SLOT, PADDING_REQ_POOL_INDEX


def test_request_rows_skip_the_scratch_row_and_free_resets_the_row() -> None:
    pool = ReqToTokenPool(max_num_reqs=3, max_context_len=8, device="cpu")
    rows = [pool.alloc() for _ in range(3)]
    assert PADDING_REQ_POOL_INDEX not in rows and sorted(rows) == [1, 2, 3]
    with pytest.raises(CacheFullError, match="all 3 request rows are in use"):
        pool.alloc()
    pool.write(rows[0], 0, torch.tensor([5, 6, 7]))
    assert pool.req_to_token[rows[0], :4].tolist() == [5, 6, 7, PADDING_KV_SLOT]
    pool.free(rows[0])
    assert pool.req_to_token[rows[0]].eq(PADDING_KV_SLOT).all()
    assert pool.alloc() == rows[0]
    with pytest.raises(ValueError, match="not one this pool hands out"):
        pool.free(PADDING_REQ_POOL_INDEX)
    with pytest.raises(CacheFullError, match="exceeds max_context_len=8"):
        pool.write(rows[1], 6, torch.tensor([1, 2, 3]))


def test_kv_slots_skip_scratch_and_come_back_after_free() -> None:
    pool = TokenToKVPool(num_slots=10, num_layers=2, num_kv_heads=2, head_dim=4, dtype=torch.float32, device="cpu")
    first = pool.alloc(4)
    second = pool.alloc(6)
    assert PADDING_KV_SLOT not in first.tolist() + second.tolist()
    assert sorted(first.tolist() + second.tolist()) == list(range(1, 11))
    with pytest.raises(CacheFullError, match="asked for 1 KV slots but only 0 of 10 are free"):
        pool.alloc(1)
    pool.free(first)
    again = pool.alloc(4)
    assert sorted(again.tolist()) == sorted(first.tolist())
    assert pool.k_buffer[0].shape == (11, 2, 4)
    assert pool.kv_bytes() == 2 * 2 * 11 * 2 * 4 * 4
