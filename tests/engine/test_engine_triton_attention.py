"""The triton attention backend's decode kernel against attention computed straight from the cached keys and values.

The kernel runs on a CUDA device where there is one and through Triton's interpreter on CPU tensors elsewhere
(``tests/conftest.py`` turns it on): one split and many, grouped-query layouts, rows of one token and rows crossing
blocks, the last-arriver merge and its counters, bound launches, and the backend through the attention op against
the torch backend.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

pytest.importorskip(
    "triton", reason=("the triton attention backend needs triton: pip install triton (CUDA builds of torch bring it)")
)


from cudagraph.backend_utils import ForwardContext, set_forward_context
from cudagraph.engine.attention import TorchAttentionBackend, make_attention_backend, unified_attention
from cudagraph.engine.attention.triton_backend import TritonAttentionBackend
from cudagraph.engine.kernels.triton.decode_attention import DecodeRows, PagedDecodeKernel
from cudagraph.engine.kernels.triton.extend_attention import ExtendRows, PagedExtendKernel, extend_rows
from cudagraph.engine.kv_cache import ReqToTokenPool, TokenToKVPool
from cudagraph.runner import PADDING_KV_SLOT, PADDING_REQ_POOL_INDEX, ForwardBatch, ForwardMode

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOLERANCE = {torch.float32: {"rtol": 1e-4, "atol": 1e-4}, torch.float16: {"rtol": 2e-3, "atol": 2e-3}}


class Cache:
    """A one-layer paged cache of random keys and values holding requests of the given lengths, each scattered over
    non-contiguous slots."""

    def __init__(self, lengths: list[int], num_kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        width = max(lengths) + 8
        self.req_pool = ReqToTokenPool(len(lengths) + 2, width, DEVICE)
        self.kv_pool = TokenToKVPool(sum(lengths) + 64, 1, num_kv_heads, head_dim, dtype, DEVICE)
        buffer = self.kv_pool.kv_buffer[0]
        buffer.copy_(torch.randn(buffer.shape, generator=generator).to(dtype))
        self.rows = []
        for length in lengths:
            row = self.req_pool.alloc()
            slots = self.kv_pool.alloc(length + 5)
            slots = slots[torch.randperm(length + 5, generator=generator)[:length].to(slots.device)]
            self.req_pool.write(row, 0, slots)
            self.rows.append(row)
        self.lengths = lengths

    @property
    def req_pool_indices(self) -> torch.Tensor:
        return torch.tensor(self.rows, dtype=torch.int64, device=DEVICE)

    @property
    def seq_lens(self) -> torch.Tensor:
        return torch.tensor(self.lengths, dtype=torch.int32, device=DEVICE)

    def expected(self, q: torch.Tensor, num_heads: int, scale: float) -> torch.Tensor:
        """Softmax attention of each row's query heads over its cached tokens, in float64."""
        buffer = self.kv_pool.kv_buffer[0].double()
        _, _, num_kv_heads, head_dim = buffer.shape
        group = num_heads // num_kv_heads
        rows = []
        for index, (row, length) in enumerate(zip(self.rows, self.lengths, strict=True)):
            slots = self.req_pool.req_to_token[row, :length].long()
            keys = buffer[slots, 0].repeat_interleave(group, dim=1)  # [L, Hq, D]
            values = buffer[slots, 1].repeat_interleave(group, dim=1)
            query = q[index].double().view(num_heads, head_dim)
            weights = torch.softmax(torch.einsum("hd,lhd->hl", query, keys) * scale, dim=-1)
            rows.append(torch.einsum("hl,lhd->hd", weights, values).reshape(-1))
        return torch.stack(rows)


def decode(kernel: PagedDecodeKernel, cache: Cache, q: torch.Tensor) -> torch.Tensor:
    output = torch.full_like(q, float("nan"))
    rows = DecodeRows(cache.req_pool_indices, cache.seq_lens)
    kernel(q, cache.kv_pool.kv_buffer[0], output, cache.req_pool.req_to_token, rows)
    return output


def make_kernel(num_heads: int, num_kv_heads: int, head_dim: int, max_context: int) -> PagedDecodeKernel:
    return PagedDecodeKernel(num_heads, num_kv_heads, head_dim, head_dim**-0.5, max_context=max_context, device=DEVICE)


@pytest.mark.parametrize("max_context", [300, 4096])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"), [(4, 2, 32), (8, 1, 16), (2, 2, 32), (6, 2, 64)], ids=str
)
def test_decode_matches_attention_over_the_cached_tokens(
    max_context: int, num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    """Splits of 256 tokens (two of them for 300 tokens, sixteen for 4096): rows of one token, of one block exactly,
    crossing blocks, of one split exactly and crossing splits."""
    lengths = [1, 128, 129, 256, 7, 257, 200, 300]
    cache = Cache(lengths, num_kv_heads, head_dim, torch.float32, seed=max_context + head_dim)
    kernel = make_kernel(num_heads, num_kv_heads, head_dim, max(max_context, 300))
    q = torch.randn(len(lengths), num_heads * head_dim, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    have = decode(kernel, cache, q)
    torch.testing.assert_close(have.double(), cache.expected(q, num_heads, head_dim**-0.5), **TOLERANCE[torch.float32])
    assert int(kernel.scratch.arrivals.abs().sum()) == 0, "the merging split should leave every count at zero"


def test_a_row_of_one_token_returns_its_value_in_every_head_of_the_group() -> None:
    cache = Cache([1, 40], 2, 32, torch.float32, seed=3)
    kernel = make_kernel(8, 2, 32, 256)
    q = torch.randn(2, 8 * 32, device=DEVICE)
    have = decode(kernel, cache, q)
    slot = int(cache.req_pool.req_to_token[cache.rows[0], 0])
    value = cache.kv_pool.kv_buffer[0][slot, 1]  # [Hkv, D]
    torch.testing.assert_close(have[0].view(2, 4, 32), value[:, None, :].expand(2, 4, 32))


def test_half_precision_decode_stays_within_half_rounding() -> None:
    cache = Cache([3, 70, 129, 400], 2, 64, torch.float16, seed=5)
    kernel = make_kernel(4, 2, 64, 512)
    q = torch.randn(4, 4 * 64, device=DEVICE).half()
    have = decode(kernel, cache, q)
    assert have.dtype == torch.float16
    torch.testing.assert_close(have.double(), cache.expected(q, 4, 64**-0.5), **TOLERANCE[torch.float16])


def test_a_row_gives_the_same_bits_in_any_batch() -> None:
    """What lets a graph's padded batch reproduce eager: a row's splits follow its length, not the batch."""
    cache = Cache([300, 5, 140, 260], 2, 32, torch.float32, seed=6)
    kernel = make_kernel(4, 2, 32, 512)
    q = torch.randn(4, 4 * 32, device=DEVICE)
    together = decode(kernel, cache, q)
    rows = cache.rows
    for index in range(4):
        cache.rows, cache.lengths = [rows[index]], [[300, 5, 140, 260][index]]
        alone = decode(kernel, cache, q[index : index + 1])
        assert torch.equal(alone[0], together[index]), f"row {index} differs alone"


def test_repeated_launches_give_the_same_output_and_reuse_the_counters() -> None:
    cache = Cache([9, 500, 33, 260], 2, 32, torch.float32, seed=7)
    kernel = make_kernel(4, 2, 32, 512)
    q = torch.randn(4, 4 * 32, device=DEVICE)
    first = decode(kernel, cache, q)
    second = decode(kernel, cache, q)
    assert torch.equal(first, second)
    assert int(kernel.scratch.arrivals.abs().sum()) == 0


def test_a_bound_launch_reads_the_lengths_and_rows_given_after_binding() -> None:
    """What a graph replays: tensors bound once, refilled in place before each launch."""
    cache = Cache([5, 290, 12, 161], 2, 32, torch.float32, seed=9)
    kernel = make_kernel(4, 2, 32, 512)
    seq_lens = torch.ones(4, dtype=torch.int32, device=DEVICE)
    req_pool_indices = torch.zeros(4, dtype=torch.int64, device=DEVICE)
    q = torch.randn(4, 4 * 32, device=DEVICE)
    output = torch.empty_like(q)
    rows = DecodeRows(req_pool_indices, seq_lens)
    launch = kernel.bind(q, cache.kv_pool.kv_buffer[0], output, cache.req_pool.req_to_token, rows)
    seq_lens.copy_(cache.seq_lens)
    req_pool_indices.copy_(cache.req_pool_indices)
    launch()
    torch.testing.assert_close(output.double(), cache.expected(q, 4, 32**-0.5), **TOLERANCE[torch.float32])


@pytest.mark.parametrize(
    ("max_context", "split_tokens", "splits"), [(100, 256, 1), (2048, 256, 8), (3000, 256, 12), (32768, 512, 64)]
)
def test_splits_are_fixed_by_the_cache_context(max_context: int, split_tokens: int, splits: int) -> None:
    kernel = make_kernel(16, 8, 32, max_context)
    assert (kernel.split_tokens, kernel.splits) == (split_tokens, splits)
    assert kernel.split_tokens % kernel.tile.block_n == 0 and kernel.splits * kernel.split_tokens >= max_context


def test_scratch_grows_for_wider_batches_and_keeps_what_graphs_hold() -> None:
    kernel = make_kernel(4, 2, 32, 512)
    kernel.reserve(3)
    first = kernel.scratch
    assert first.partial_lse.numel() == 3 * 2 * kernel.splits * 2
    kernel.reserve(2)
    assert kernel.scratch is first, "reserving fewer rows keeps the scratch"
    first_out = weakref.ref(first.partial_out)
    del first
    cache = Cache([300, 4, 9, 200, 1], 2, 32, torch.float32, seed=4)
    q = torch.randn(5, 4 * 32, device=DEVICE)
    have = decode(kernel, cache, q)  # an eager batch wider than reserved grows it
    gc.collect()
    assert kernel.scratch.rows == 5
    assert first_out() is not None, "the outgrown scratch stays alive: graphs captured with it still write there"
    torch.testing.assert_close(have.double(), cache.expected(q, 4, 32**-0.5), **TOLERANCE[torch.float32])


@pytest.mark.parametrize("head_dim", [24, 8])
def test_head_dims_the_kernel_cannot_tile_are_refused(head_dim: int) -> None:
    with pytest.raises(ValueError, match=f"power-of-two head_dim of at least 16, got {head_dim}"):
        PagedDecodeKernel(4, 2, head_dim, 1.0, max_context=64, device=DEVICE)


@pytest.mark.skipif(
    DEVICE.type == "cuda",
    reason=("checks the refusal of CPU tensors, and this machine has CUDA: `nox -s tests` on a CPU machine runs it"),
)
def test_the_backend_refuses_cpu_tensors_without_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cache = Cache([4], 2, 32, torch.float32, seed=0)
    with pytest.raises(ValueError, match=r"needs a CUDA device, not cpu .*use 'torch'"):
        TritonAttentionBackend(cache.req_pool, cache.kv_pool, 4, 2, 32)


def decode_batch(cache: Cache, out_cache_loc: torch.Tensor) -> ForwardBatch:
    seq_lens = cache.seq_lens
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=len(cache.rows),
        input_ids=torch.zeros(len(cache.rows), dtype=torch.int64, device=DEVICE),
        positions=(seq_lens - 1).long(),
        seq_lens=seq_lens,
        req_pool_indices=cache.req_pool_indices,
        out_cache_loc=out_cache_loc,
        seq_lens_sum=int(seq_lens.sum()),
        seq_lens_cpu=seq_lens.cpu(),
    )


def attend(backend: TorchAttentionBackend, batch: ForwardBatch, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    backend.init_forward_metadata(batch)
    output = torch.full_like(q, float("nan"))
    with set_forward_context(ForwardContext(forward_batch=batch, attn_backend=backend)):
        unified_attention(q, k, k, output, 0)
    return output


def test_the_backend_stores_and_attends_like_the_torch_backend() -> None:
    """Through the registered op: the step's keys and values are stored first (the last slot of each row), then
    attended to, by both backends over the same pools."""
    cache = Cache([3, 77, 1, 140, 290], 2, 32, torch.float32, seed=11)
    shape = type("Shape", (), {"num_heads": 4, "num_kv_heads": 2, "head_dim": 32, "attention_scale": None})()
    triton_backend = make_attention_backend("triton", cache.req_pool, cache.kv_pool, shape)
    torch_backend = make_attention_backend("torch", cache.req_pool, cache.kv_pool, shape)
    assert isinstance(triton_backend, TritonAttentionBackend) and triton_backend.name == "triton"
    last_slots = torch.stack(
        [cache.req_pool.req_to_token[row, length - 1] for row, length in zip(cache.rows, cache.lengths, strict=True)]
    ).long()
    batch = decode_batch(cache, last_slots)
    q = torch.randn(5, 4 * 32, device=DEVICE)
    k = torch.randn(5, 2 * 32, device=DEVICE)
    have = attend(triton_backend, batch, q, k)
    want = attend(torch_backend, batch, q, k)
    torch.testing.assert_close(have, want, **TOLERANCE[torch.float32])
    stored = cache.kv_pool.kv_buffer[0][last_slots]
    assert torch.equal(stored[:, 0].reshape(5, -1), k) and torch.equal(stored[:, 1].reshape(5, -1), k)
    # A bound decode break launches the same kernel on the same tensors.
    bound_output = torch.empty_like(q)
    bound = triton_backend.bind_forward(q, k, k, bound_output, 0, batch, kv_stored=True)
    assert bound is not None
    bound()
    assert torch.equal(bound_output, have)


def extend_batch(cache: Cache, new_tokens: list[int], padded_tokens: int) -> ForwardBatch:
    """An extend batch over ``cache``'s requests: request ``i`` adds its last ``new_tokens[i]`` tokens (0: a request
    row with no tokens, as a graph's padded rows are), then ``padded_tokens`` tokens that belong to no request."""
    positions, slots, starts, start = [], [], [], 0
    for row, length, count in zip(cache.rows, cache.lengths, new_tokens, strict=True):
        positions += range(length - count, length)
        slots.append(cache.req_pool.req_to_token[row, length - count : length].long())
        starts.append(start if count else 0)
        start += count
    positions += [0] * padded_tokens
    slots.append(torch.full((padded_tokens,), PADDING_KV_SLOT, dtype=torch.int64, device=DEVICE))
    lengths = torch.tensor(cache.lengths, dtype=torch.int32, device=DEVICE)
    counts = torch.tensor(new_tokens, dtype=torch.int32, device=DEVICE)
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=len(cache.rows),
        input_ids=torch.zeros(len(positions), dtype=torch.int64, device=DEVICE),
        positions=torch.tensor(positions, dtype=torch.int64, device=DEVICE),
        seq_lens=lengths,
        req_pool_indices=cache.req_pool_indices,
        out_cache_loc=torch.cat(slots),
        seq_lens_sum=sum(cache.lengths),
        seq_lens_cpu=lengths.cpu(),
        extend_seq_lens=counts,
        extend_prefix_lens=lengths - counts,
        extend_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        extend_num_tokens=start,
        extend_seq_lens_cpu=list(new_tokens),
        extend_prefix_lens_cpu=[length - count for length, count in zip(cache.lengths, new_tokens, strict=True)],
    )


def test_extend_rows_give_each_new_token_its_request_row_and_causal_length_and_block_requests_apart() -> None:
    cache = Cache([5, 3, 4], 1, 16, torch.float32, seed=2)
    batch = extend_batch(cache, [2, 0, 4], padded_tokens=2)  # the middle request adds nothing
    rows = extend_rows(batch, block_m=3)
    first, _, third = cache.rows
    assert rows.req_pool_indices.tolist() == [first] * 2 + [third] * 4 + [PADDING_REQ_POOL_INDEX] * 2
    assert rows.seq_lens.tolist() == [4, 5, 1, 2, 3, 4, 1, 1] and rows.seq_lens.dtype == torch.int32
    # cdiv(8 tokens, 3) + 3 requests + 1 = 7 blocks: the first request's 2 tokens, the third's 3 + 1, the 2 padded
    # tokens, then unused ones.
    assert rows.block_starts.tolist()[:4] == [0, 2, 5, 6]
    assert rows.block_counts.tolist() == [2, 3, 1, 2, 0, 0, 0]


@pytest.mark.parametrize(("new_tokens", "padded_tokens"), [([2, 77, 1, 0, 9], 3), ([3, 77, 1, 140, 290], 0)])
def test_extend_attends_like_the_torch_backend_over_prefixes_and_new_tokens(
    new_tokens: list[int], padded_tokens: int
) -> None:
    """Through the registered op: each new token attends causally to its request's prefix and the new tokens up to
    itself (whole prompts, prompts after a cached prefix, a request with no new tokens, padded tokens)."""
    cache = Cache([3, 77, 1, 140, 290], 2, 32, torch.float32, seed=5)
    shape = type("Shape", (), {"num_heads": 4, "num_kv_heads": 2, "head_dim": 32, "attention_scale": None})()
    triton_backend = make_attention_backend("triton", cache.req_pool, cache.kv_pool, shape)
    torch_backend = make_attention_backend("torch", cache.req_pool, cache.kv_pool, shape)
    batch = extend_batch(cache, new_tokens, padded_tokens)
    tokens, real = batch.positions.shape[0], sum(new_tokens)
    generator = torch.Generator().manual_seed(6)
    q = torch.randn(tokens, 4 * 32, generator=generator).to(DEVICE)
    k = torch.randn(tokens, 2 * 32, generator=generator).to(DEVICE)
    have = attend(triton_backend, batch, q, k)
    assert isinstance(batch.attn_metadata, ExtendRows), "init_forward_metadata laid the step out"
    want = attend(torch_backend, batch, q, k)
    torch.testing.assert_close(have[:real], want[:real], **TOLERANCE[torch.float32])
    assert torch.isfinite(have).all(), "padded tokens attend to the scratch row, never to garbage"
    # A breakable replay's break finds no metadata (the runner cleared it) and lays the step out itself.
    batch.attn_metadata = None
    output = torch.full_like(q, float("nan"))
    triton_backend.forward(q, k, k, output, 0, batch, kv_stored=True)
    torch.testing.assert_close(output, have, rtol=0, atol=0)


def test_a_bound_extend_launch_reads_the_rows_and_queries_refilled_after_binding() -> None:
    """What a breakable or tc_piecewise prefill replays: the extend launch bound at capture to the batch's
    ``ExtendRows`` (remade in place by the graph at each replay) and to static q and output."""
    cache = Cache([3, 77, 1, 140, 290], 2, 32, torch.float32, seed=5)
    shape = type("Shape", (), {"num_heads": 4, "num_kv_heads": 2, "head_dim": 32, "attention_scale": None})()
    backend = make_attention_backend("triton", cache.req_pool, cache.kv_pool, shape)
    captured = extend_batch(cache, [1, 1, 1, 1, 1], padded_tokens=3)  # the graph's batch at capture: 8 tokens
    backend.init_forward_metadata(captured)
    rows = captured.attn_metadata
    assert isinstance(rows, ExtendRows)
    q, output = torch.zeros(8, 4 * 32, device=DEVICE), torch.full((8, 4 * 32), float("nan"), device=DEVICE)
    bound = backend.bind_forward(q, q, q, output, 0, captured, kv_stored=True)
    assert bound is not None
    # A later step of other lengths in the same 8 tokens: the graph remakes the rows and loads q in place.
    step = extend_batch(cache, [2, 3, 0, 1, 0], padded_tokens=2)
    fresh = backend.extend_kernel.rows_of(step)
    for name in ("req_pool_indices", "seq_lens", "block_starts", "block_counts"):
        getattr(rows, name).copy_(getattr(fresh, name))
    q.copy_(torch.randn(8, 4 * 32, generator=torch.Generator().manual_seed(3)).to(DEVICE))
    bound()
    want = torch.full_like(output, float("nan"))
    backend.forward(q, q[:, : 2 * 32], q[:, : 2 * 32], want, 0, step, kv_stored=True)
    torch.testing.assert_close(output, want, rtol=0, atol=0)
    assert backend.bind_forward(q, q, q, output, 0, extend_batch(cache, [1] * 5, 3), kv_stored=True) is None


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (6, 2), (16, 2)])
def test_extend_kernel_blocks_of_many_tokens_match_attention_over_each_causal_prefix(
    num_heads: int, num_kv_heads: int
) -> None:
    """Long prompts (several blocks a request, a last block partly filled) for group sizes 1, 3 (padded to 4) and 8,
    against float64 attention over each token's causal prefix."""
    cache = Cache([70, 1, 45], num_kv_heads, 16, torch.float32, seed=4)
    kernel = PagedExtendKernel(num_heads, num_kv_heads, 16, 16**-0.5, block_n=16)
    batch = extend_batch(cache, [60, 1, 45], padded_tokens=4)
    rows = kernel.rows_of(batch)
    q = torch.randn(batch.positions.shape[0], num_heads * 16, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    output = torch.full_like(q, float("nan"))
    kernel(q, cache.kv_pool.kv_buffer[0], output, cache.req_pool.req_to_token, rows)
    buffer = cache.kv_pool.kv_buffer[0].double()
    group = num_heads // num_kv_heads
    for token in range(106):
        row, length = int(rows.req_pool_indices[token]), int(rows.seq_lens[token])
        slots = cache.req_pool.req_to_token[row, :length].long()
        keys = buffer[slots, 0].repeat_interleave(group, dim=1)
        values = buffer[slots, 1].repeat_interleave(group, dim=1)
        query = q[token].double().view(num_heads, 16)
        weights = torch.softmax(torch.einsum("hd,lhd->hl", query, keys) * 16**-0.5, dim=-1)
        want = torch.einsum("hl,lhd->hd", weights, values).reshape(-1)
        torch.testing.assert_close(output[token].double(), want, rtol=1e-4, atol=1e-4, msg=f"token {token}")
    assert output[106:].isfinite().all(), "padded tokens attend to the scratch row"
