"""Page tables for paged kernels against a plain Python walk of the request-to-token table, page sizes 1 and 16."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from cudagraph.engine.attention.paging import ExtendLengths, HostPages, lay_out_pages
from cudagraph.engine.kv_cache import ReqToTokenPool, TokenToKVPool
from cudagraph.runner import ForwardBatch, ForwardMode


def cache_with_requests(page_size: int, lengths: list[int]) -> tuple[ReqToTokenPool, list[int], list[torch.Tensor]]:
    """Requests of ``lengths`` tokens allocated after a gap, so a page id is never a row-relative index."""
    req_pool = ReqToTokenPool(8, 64, "cpu", page_size=page_size)
    kv_pool = TokenToKVPool(8 * 64, 1, 1, 4, torch.float32, "cpu", page_size=page_size)
    kv_pool.alloc(page_size * 3)  # leave a gap before the first request's pages
    rows, slots = [], []
    for length in lengths:
        row = req_pool.alloc()
        request_slots = kv_pool.alloc(length)
        req_pool.write(row, 0, request_slots)
        rows.append(row)
        slots.append(request_slots)
    return req_pool, rows, slots


def expected_pages(slots: list[torch.Tensor], page_size: int) -> list[int]:
    return [int(s) // page_size for request in slots for s in request[::page_size]]


@pytest.mark.parametrize("page_size", [1, 16])
def test_pages_are_laid_out_back_to_back_with_padding_rows(page_size: int) -> None:
    lengths = [1, 16, 17, 40]
    req_pool, rows, slots = cache_with_requests(page_size, lengths)
    # Two padding rows, as a graph bucket has them: the scratch row, one token.
    req_pool_indices = torch.tensor([*rows, 0, 0])
    seq_lens = torch.tensor([*lengths, 1, 1], dtype=torch.int32)
    pages_per_row = req_pool.max_pages_per_request
    indices = torch.full((len(req_pool_indices) * pages_per_row + 1,), -7, dtype=torch.int32)
    indptr = torch.full((len(req_pool_indices) + 1,), -7, dtype=torch.int32)
    indptr[0] = 0
    last_page_len = torch.full((len(req_pool_indices),), -7, dtype=torch.int32)
    lay_out_pages(
        indices, req_pool.req_to_token, req_pool_indices, seq_lens, page_size, pages_per_row, (indptr, last_page_len)
    )
    host = HostPages.of(seq_lens, page_size)
    # What the graph step writes itself equals what the host plan reads, so a re-plan needs no copy of either.
    assert torch.equal(indptr, host.indptr) and torch.equal(last_page_len, host.last_page_len)
    want = [*expected_pages(slots, page_size), 0, 0]  # padding rows read the scratch page
    assert indices[: host.total].tolist() == want
    assert host.indptr.tolist()[1:] == torch.cumsum(-(-seq_lens // page_size), 0).tolist()
    assert host.last_page_len.tolist() == [(n - 1) % page_size + 1 for n in seq_lens.tolist()]
    assert indices[host.total : -1].eq(-7).all(), "nothing past the last row's pages is written but the dump slot"


def extend_batch(new: list[int], prefix: list[int]) -> ForwardBatch:
    empty = torch.zeros(0, dtype=torch.int64)
    return ForwardBatch(
        ForwardMode.EXTEND, len(new), empty, empty, empty, empty, empty, 0,
        extend_seq_lens_cpu=new, extend_prefix_lens_cpu=prefix,
    )  # fmt: skip


def test_extend_lengths_pad_rows_with_no_query_and_one_scratch_token() -> None:
    lengths = ExtendLengths.of(extend_batch([5, 2], [0, 14]), padded_rows=2)
    assert lengths.new_tokens == [5, 2, 0, 0]
    assert lengths.context_tokens == [5, 16, 1, 1]
    assert lengths.qo_indptr().tolist() == [0, 5, 7, 7, 7]
    assert lengths.host_pages(16).indptr.tolist() == [0, 1, 2, 3, 4]
    assert lengths.host_pages(4).last_page_len.tolist() == [1, 4, 1, 1]


def test_extend_lengths_need_the_host_lengths() -> None:
    batch = extend_batch([5], [0])
    batch.extend_prefix_lens_cpu = None
    with pytest.raises(ValueError, match="extend_seq_lens_cpu and extend_prefix_lens_cpu"):
        ExtendLengths.of(batch)


@given(
    lengths=st.lists(st.integers(min_value=1, max_value=5000), min_size=1, max_size=300),
    page_size=st.sampled_from([1, 2, 16, 64]),
    as_tensor=st.sampled_from([None, torch.int32, torch.int64]),
)
def test_host_pages_count_each_rows_pages_and_last_page_fill(
    lengths: list[int], page_size: int, as_tensor: torch.dtype | None
) -> None:
    given_lengths = lengths if as_tensor is None else torch.tensor(lengths, dtype=as_tensor)
    host = HostPages.of(given_lengths, page_size)
    pages = [(length + page_size - 1) // page_size for length in lengths]
    assert host.indptr.dtype == host.last_page_len.dtype == torch.int32
    assert host.indptr.tolist() == [sum(pages[:row]) for row in range(len(lengths) + 1)]
    assert host.total == sum(pages)
    assert host.last_page_len.tolist() == [
        length - (count - 1) * page_size for length, count in zip(lengths, pages, strict=True)
    ]
    assert all(1 <= fill <= page_size for fill in host.last_page_len.tolist())


def test_page_ids_are_the_same_with_or_without_count_buffers() -> None:
    lengths = [3, 20, 33]
    req_pool, rows, slots = cache_with_requests(16, lengths)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    width = req_pool.max_pages_per_request
    alone = torch.zeros(len(rows) * width + 1, dtype=torch.int32)
    with_counts = alone.clone()
    lay_out_pages(alone, req_pool.req_to_token, torch.tensor(rows), seq_lens, 16, width)
    counts = (torch.zeros(len(rows) + 1, dtype=torch.int32), torch.zeros(len(rows), dtype=torch.int32))
    lay_out_pages(with_counts, req_pool.req_to_token, torch.tensor(rows), seq_lens, 16, width, counts)
    assert torch.equal(alone, with_counts)
    assert alone[: sum(-(-n // 16) for n in lengths)].tolist() == expected_pages(slots, 16)


@pytest.mark.parametrize("layout", ["side_by_side", "separate", "strided"])
def test_a_bound_store_writes_what_store_writes_with_the_values_of_each_step(layout: str) -> None:
    """A replay binds the KV store once; each call must store the current contents of the same k and v tensors."""
    heads, dim, rows = 2, 4, 3
    bound_pool = TokenToKVPool(64, 2, heads, dim, torch.float32, "cpu", page_size=4)
    eager_pool = TokenToKVPool(64, 2, heads, dim, torch.float32, "cpu", page_size=4)
    if layout == "side_by_side":
        qkv = torch.zeros(rows, 3 * heads * dim)
        k, v = qkv[:, heads * dim : 2 * heads * dim], qkv[:, 2 * heads * dim :]
    elif layout == "separate":
        k, v = torch.zeros(rows, heads * dim), torch.zeros(rows, heads * dim)
    else:  # every other row of a larger tensor: not side by side, yet viewable as [T, H, D]
        k, v = torch.zeros(2 * rows, heads * dim)[::2], torch.zeros(2 * rows, heads * dim)[::2]
    slots = torch.tensor([5, 9, 17])
    calls = bound_pool.bind_store(1, slots, k, v)
    for step in range(3):
        k.copy_(torch.randn(rows, heads * dim))
        v.copy_(torch.randn(rows, heads * dim))
        for call in calls:
            call()
        eager_pool.store(1, slots, k, v)
        torch.testing.assert_close(bound_pool.kv_buffer[1], eager_pool.kv_buffer[1], msg=f"step {step}")
    assert bound_pool.kv_buffer[1][slots].abs().sum() > 0
    torch.testing.assert_close(bound_pool.kv_buffer[0], torch.zeros_like(bound_pool.kv_buffer[0]))
