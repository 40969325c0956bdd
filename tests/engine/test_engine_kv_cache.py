"""The paged KV cache: scratch row and slot are never handed out; allocation round-trips; keys and values are stored
with one op where the model keeps them side by side."""

from __future__ import annotations

import pytest
import torch

from cudagraph.engine.kv_cache import CacheFullError, ReqToTokenPool, TokenToKVPool
from cudagraph.engine.model import dense_attend, model_config_from_preset, random_model
from cudagraph.engine.testing import DispatchedOps
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


def test_page_size_16_hands_out_whole_pages_in_token_order() -> None:
    pool = TokenToKVPool(
        num_slots=40, num_layers=1, num_kv_heads=2, head_dim=4, dtype=torch.float32, device="cpu", page_size=16
    )
    assert (pool.num_pages, pool.num_slots, pool.available) == (3, 48, 48)  # 40 slots round up to 3 pages
    first = pool.alloc(20)  # 2 pages, the second one partly used
    assert first.numel() == 20
    pages = (first // 16).tolist()
    assert pages[:16] == [pages[0]] * 16 and pages[16:] == [pages[16]] * 4 and pages[0] != pages[16]
    assert (first % 16).tolist() == list(range(16)) + list(range(4))
    assert 0 not in pages, "page 0 holds the scratch slot and is never handed out"
    assert pool.available == 16
    with pytest.raises(CacheFullError, match=r"asked for 17 KV slots but only 16 of 48 are free \(whole pages of 16"):
        pool.alloc(17)
    last = pool.alloc(16)
    assert sorted({*pages, *(last // 16).tolist()}) == [1, 2, 3]
    pool.free(first)
    assert pool.available == 32
    assert sorted((pool.alloc(32) // 16).unique().tolist()) == sorted(set(pages))


def test_paged_layout_is_the_flat_slot_layout() -> None:
    pool = TokenToKVPool(
        num_slots=32, num_layers=2, num_kv_heads=2, head_dim=4, dtype=torch.float32, device="cpu", page_size=16
    )
    assert pool.kv_pages[1].shape == (3, 16, 2, 2, 4)
    slot = 16 * 2 + 5
    pool.k_buffer[1][slot] = 7.0  # stored by flat slot, as out_cache_loc addresses it
    assert pool.kv_pages[1][2, 5, 0].eq(7.0).all() and pool.kv_pages[1].eq(7.0).sum() == 8
    assert pool.kv_bytes() == 2 * 3 * 16 * 2 * 2 * 4 * 4


def test_request_rows_span_whole_pages() -> None:
    pool = ReqToTokenPool(max_num_reqs=2, max_context_len=40, device="cpu", page_size=64)
    assert pool.req_to_token.shape == (3, 64) and pool.max_pages_per_request == 1
    assert ReqToTokenPool(2, 40, "cpu", page_size=4).req_to_token.shape == (3, 48)  # the 16-column alignment wins


@pytest.mark.parametrize("page_size", [0, 3, 24, 256, -16])
def test_page_sizes_other_than_powers_of_two_up_to_128_are_refused(page_size: int) -> None:
    with pytest.raises(ValueError, match=rf"page_size={page_size} .*allowed: 1, 2, 4, \.\.\. 128"):
        TokenToKVPool(8, 1, 1, 4, torch.float32, "cpu", page_size=page_size)


def model_keys_and_values(preset: str, tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The keys and values the model hands to ``attend`` in every layer, for ``tokens`` tokens."""
    model = random_model(model_config_from_preset(preset))
    attend = dense_attend(model.config)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def recording(layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        seen.append((k, v))
        return attend(layer_id, q, k, v)

    with torch.inference_mode():
        model(torch.arange(tokens), torch.arange(tokens), recording)
    return seen


@pytest.mark.parametrize("preset", ["tiny-qwen3-random", "tiny-llama-random"])
@pytest.mark.parametrize("tokens", [1, 6])
def test_the_models_keys_and_values_are_stored_with_one_op(preset: str, tokens: int) -> None:
    """The model writes its normed, rotated keys back into the fused projection, so the values follow them in every
    row of one tensor and the store is one ``index_put_`` of a view: no stack, no copy."""
    config = model_config_from_preset(preset)
    pool = TokenToKVPool(16, config.num_layers, config.num_kv_heads, config.head_dim, torch.float32, "cpu")
    slots = torch.randperm(16)[:tokens] + 1
    stored = model_keys_and_values(preset, tokens)
    assert len(stored) == config.num_layers
    for layer_id, (k, v) in enumerate(stored):
        with DispatchedOps() as recorded:
            pool.store(layer_id, slots, k, v)
        assert recorded.computed == ["aten.index_put_.default"]
        assert torch.equal(pool.k_buffer[layer_id][slots].flatten(1), k)
        assert torch.equal(pool.v_buffer[layer_id][slots].flatten(1), v)


def test_keys_and_values_from_separate_tensors_are_paired_up_first() -> None:
    pool = TokenToKVPool(num_slots=8, num_layers=1, num_kv_heads=2, head_dim=4, dtype=torch.float32, device="cpu")
    keys, values = torch.randn(3, 8), torch.randn(3, 8)
    slots = torch.tensor([5, 1, 7])
    with DispatchedOps() as recorded:
        pool.store(0, slots, keys, values)
    assert recorded.computed == ["aten.stack.default", "aten.index_put_.default"]
    assert torch.equal(pool.k_buffer[0][slots].flatten(1), keys)
    assert torch.equal(pool.v_buffer[0][slots].flatten(1), values)
    assert pool.kv_buffer[0][[0, 2, 3, 4, 6, 8]].eq(0).all(), "no other slot is written"


def test_values_right_after_keys_in_a_wider_tensor_are_stored_from_a_view() -> None:
    """Side by side is about memory, not about where the tensors came from: k and v as columns of one tensor whose
    rows hold more (q first, as in the projection)."""
    pool = TokenToKVPool(num_slots=8, num_layers=2, num_kv_heads=1, head_dim=4, dtype=torch.float32, device="cpu")
    projection = torch.randn(4, 12)
    keys, values = projection[:, 4:8], projection[:, 8:]
    slots = torch.tensor([2, 3, 8, 6])
    with DispatchedOps() as recorded:
        pool.store(1, slots, keys, values)
    assert recorded.computed == ["aten.index_put_.default"]
    assert torch.equal(pool.k_buffer[1][slots, 0], keys) and torch.equal(pool.v_buffer[1][slots, 0], values)
    assert pool.kv_buffer[0].eq(0).all(), "only the layer asked for is written"
