"""The torch attention backend against dense attention computed straight from the keys and values."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from cudagraph.backend_utils import ForwardContext, model_capture_mode, set_forward_context
from cudagraph.engine.attention import (
    AttentionBackendUnavailableError,
    TorchAttentionBackend,
    make_attention_backend,
    unified_attention,
)
from cudagraph.engine.kv_cache import ReqToTokenPool, TokenToKVPool
from cudagraph.runner import ForwardBatch, ForwardMode

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 8


def dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_positions: torch.Tensor) -> torch.Tensor:
    """Attention of queries at ``query_positions`` over keys 0..position, heads repeated for GQA."""
    group = HEADS // KV_HEADS
    query = q.view(-1, HEADS, HEAD_DIM).transpose(0, 1)
    key = k.view(-1, KV_HEADS, HEAD_DIM).transpose(0, 1).repeat_interleave(group, 0)
    value = v.view(-1, KV_HEADS, HEAD_DIM).transpose(0, 1).repeat_interleave(group, 0)
    mask = torch.arange(k.shape[0])[None, :] <= query_positions[:, None]
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    return out.transpose(0, 1).reshape(-1, HEADS * HEAD_DIM)


class Setup:
    """A one-layer cache holding requests of the given lengths, with their full keys and values kept aside."""

    def __init__(self, lengths: list[int], seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.req_pool = ReqToTokenPool(8, 32, "cpu")
        self.kv_pool = TokenToKVPool(128, 1, KV_HEADS, HEAD_DIM, torch.float32, "cpu")
        self.backend = TorchAttentionBackend(self.req_pool, self.kv_pool, HEADS, KV_HEADS, HEAD_DIM)
        self.rows, self.slots, self.keys, self.values = [], [], [], []
        for length in lengths:
            row = self.req_pool.alloc()
            # Scatter each request over non-contiguous slots, as a busy cache would.
            slots = self.kv_pool.alloc(length + 3)[torch.randperm(length + 3)[:length]]
            self.req_pool.write(row, 0, slots)
            self.rows.append(row)
            self.slots.append(slots)
            self.keys.append(torch.randn(length, KV_HEADS * HEAD_DIM))
            self.values.append(torch.randn(length, KV_HEADS * HEAD_DIM))

    def cache_prefix(self, index: int, count: int) -> None:
        shape = (-1, KV_HEADS, HEAD_DIM)
        self.kv_pool.k_buffer[0][self.slots[index][:count]] = self.keys[index][:count].view(shape)
        self.kv_pool.v_buffer[0][self.slots[index][:count]] = self.values[index][:count].view(shape)

    def run(self, batch: ForwardBatch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        output = torch.full_like(q, float("nan"))
        with set_forward_context(ForwardContext(forward_batch=batch, attn_backend=self.backend, extra={})):
            unified_attention(q, k, v, output, 0)
        return output


def decode_batch(setup: Setup) -> tuple[ForwardBatch, torch.Tensor, torch.Tensor, torch.Tensor]:
    lengths = [len(k) for k in setup.keys]
    for index, length in enumerate(lengths):
        setup.cache_prefix(index, length - 1)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    batch = ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=len(lengths),
        input_ids=torch.zeros(len(lengths), dtype=torch.int64),
        positions=(seq_lens - 1).long(),
        seq_lens=seq_lens,
        req_pool_indices=torch.tensor(setup.rows),
        out_cache_loc=torch.stack([slots[-1] for slots in setup.slots]),
        seq_lens_sum=int(seq_lens.sum()),
        seq_lens_cpu=seq_lens,
    )
    q = torch.randn(len(lengths), HEADS * HEAD_DIM)
    k = torch.stack([keys[-1] for keys in setup.keys])
    v = torch.stack([values[-1] for values in setup.values])
    return batch, q, k, v


def expected_decode(setup: Setup, q: torch.Tensor) -> torch.Tensor:
    rows = []
    for index, (keys, values) in enumerate(zip(setup.keys, setup.values, strict=True)):
        rows.append(dense(q[index : index + 1], keys, values, torch.tensor([len(keys) - 1])))
    return torch.cat(rows)


@pytest.mark.parametrize("lengths", [[1], [5], [3, 9, 1, 14]])
def test_eager_decode_matches_dense(lengths: list[int]) -> None:
    setup = Setup(lengths)
    batch, q, k, v = decode_batch(setup)
    setup.backend.init_forward_metadata(batch)
    torch.testing.assert_close(setup.run(batch, q, k, v), expected_decode(setup, q), rtol=1e-5, atol=1e-5)


def test_graph_path_decode_matches_dense_with_padding_rows() -> None:
    """The static-metadata path a graph captures, with the batch padded to 6 rows the way the runner pads."""
    setup = Setup([4, 11, 2])
    batch, q, k, v = decode_batch(setup)
    padded_rows = 6
    fill = setup.backend.get_cuda_graph_seq_len_fill_value()
    pad = padded_rows - batch.batch_size

    def padded(tensor: torch.Tensor, value: int) -> torch.Tensor:
        return torch.cat([tensor, torch.full((pad, *tensor.shape[1:]), value, dtype=tensor.dtype)])

    static = ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=padded_rows,
        input_ids=padded(batch.input_ids, 0),
        positions=padded(batch.positions, 0),
        seq_lens=padded(batch.seq_lens, fill),
        req_pool_indices=padded(batch.req_pool_indices, 0),
        out_cache_loc=padded(batch.out_cache_loc, 0),
        seq_lens_sum=batch.seq_lens_sum + pad * fill,
    )
    setup.backend.init_cuda_graph_state(8, 8)
    setup.backend.init_forward_metadata_capture_cuda_graph(
        padded_rows, padded_rows, static.req_pool_indices, static.seq_lens, ForwardMode.DECODE
    )
    with model_capture_mode():
        setup.backend.init_forward_metadata(static)
        assert setup.backend.forward_metadata.kv_slots.shape == (padded_rows, setup.req_pool.max_context_len)
        out = setup.run(static, padded(q, 0), padded(k, 0), padded(v, 0))
    torch.testing.assert_close(out[:3], expected_decode(setup, q), rtol=1e-5, atol=1e-5)
    assert torch.isfinite(out[3:]).all()


def test_extend_with_and_without_prefix_matches_dense() -> None:
    setup = Setup([7, 12, 5])
    prefix_lens = [0, 5, 2]
    for index, prefix in enumerate(prefix_lens):
        setup.cache_prefix(index, prefix)
    extend_lens = [len(keys) - prefix for keys, prefix in zip(setup.keys, prefix_lens, strict=True)]
    starts = [sum(extend_lens[:i]) for i in range(3)]
    num_tokens = sum(extend_lens)
    padded_tokens = num_tokens + 4  # graph padding: tokens no request owns
    q = torch.randn(padded_tokens, HEADS * HEAD_DIM)
    k = torch.cat([keys[p:] for keys, p in zip(setup.keys, prefix_lens, strict=True)] + [torch.zeros(4, 16)])
    v = torch.cat([vals[p:] for vals, p in zip(setup.values, prefix_lens, strict=True)] + [torch.zeros(4, 16)])
    seq_lens = torch.tensor([len(keys) for keys in setup.keys], dtype=torch.int32)
    batch = ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=3,
        input_ids=torch.zeros(padded_tokens, dtype=torch.int64),
        positions=torch.zeros(padded_tokens, dtype=torch.int64),
        seq_lens=seq_lens,
        req_pool_indices=torch.tensor(setup.rows),
        out_cache_loc=torch.cat(
            [s[p:] for s, p in zip(setup.slots, prefix_lens, strict=True)] + [torch.zeros(4).long()]
        ),
        seq_lens_sum=int(seq_lens.sum()),
        seq_lens_cpu=seq_lens,
        extend_seq_lens=torch.tensor(extend_lens, dtype=torch.int32),
        extend_prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32),
        extend_start_loc=torch.tensor(starts, dtype=torch.int32),
        extend_num_tokens=num_tokens,
        extend_seq_lens_cpu=extend_lens,
        extend_prefix_lens_cpu=prefix_lens,
    )
    setup.backend.init_forward_metadata(batch)
    out = setup.run(batch, q, k, v)
    for index, (prefix, start, count) in enumerate(zip(prefix_lens, starts, extend_lens, strict=True)):
        positions = torch.arange(prefix, prefix + count)
        want = dense(q[start : start + count], setup.keys[index], setup.values[index], positions)
        torch.testing.assert_close(out[start : start + count], want, rtol=1e-5, atol=1e-5)
    assert out[num_tokens:].eq(0).all()
    # The new keys landed in the cache at their slots.
    torch.testing.assert_close(setup.kv_pool.k_buffer[0][setup.slots[1]].reshape(12, -1), setup.keys[1])


def test_the_op_needs_a_forward_context() -> None:
    q = torch.zeros(1, HEADS * HEAD_DIM)
    with pytest.raises(RuntimeError):
        unified_attention(q, q[:, :16], q[:, :16], torch.empty_like(q), 0)


def graph_decode_setup(lengths: list[int]) -> tuple[Setup, ForwardBatch, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A decode batch on the graph path: the capture hook chose the static metadata, filled as a capture fills it."""
    setup = Setup(lengths)
    batch, q, k, v = decode_batch(setup)
    setup.backend.init_cuda_graph_state(8, 8)
    setup.backend.init_forward_metadata_capture_cuda_graph(
        batch.batch_size, batch.batch_size, batch.req_pool_indices, batch.seq_lens, ForwardMode.DECODE
    )
    with model_capture_mode():
        setup.backend.init_forward_metadata(batch)
    return setup, batch, q, k, v


@pytest.mark.parametrize("kv_stored", [True, False])
def test_a_bound_decode_computes_what_forward_computes_bit_for_bit(kv_stored: bool) -> None:
    setup, batch, q, k, v = graph_decode_setup([4, 11, 2, 7])
    cache_before = setup.kv_pool.kv_buffer[0].clone()
    want = torch.full_like(q, float("nan"))
    setup.backend.forward(q, k, v, want, 0, batch, kv_stored=kv_stored)
    cache_after_forward = setup.kv_pool.kv_buffer[0].clone()
    setup.kv_pool.kv_buffer[0].copy_(cache_before)
    have = torch.full_like(q, float("nan"))
    bound = setup.backend.bind_forward(q, k, v, have, 0, batch, kv_stored=kv_stored)
    assert bound is not None
    bound()
    assert torch.equal(have, want)
    assert torch.equal(setup.kv_pool.kv_buffer[0], cache_after_forward)
    assert kv_stored == torch.equal(cache_after_forward, cache_before), "only kv_stored=False writes the cache"


def test_a_bound_decode_reads_the_static_metadata_refilled_after_binding() -> None:
    setup, batch, q, k, v = graph_decode_setup([4, 11, 2])
    output = torch.empty_like(q)
    bound = setup.backend.bind_forward(q, k, v, output, 0, batch, kv_stored=True)
    assert bound is not None
    # A later step: one more cached token per request, refilled in place into the same static metadata.
    for index, length in enumerate(len(keys) for keys in setup.keys):
        setup.cache_prefix(index, length)
    batch.seq_lens.add_(1)
    with model_capture_mode():
        setup.backend.init_forward_metadata(batch)
    bound()
    want = torch.empty_like(q)
    setup.backend.forward(q, k, v, want, 0, batch, kv_stored=True)
    assert torch.equal(output, want)


def test_nothing_is_bound_for_eager_metadata_or_extend_batches() -> None:
    setup = Setup([3, 5])
    batch, q, k, v = decode_batch(setup)
    setup.backend.init_forward_metadata(batch)  # eager: per-step metadata, no static view to bind to
    assert setup.backend.bind_forward(q, k, v, torch.empty_like(q), 0, batch) is None
    extend = ForwardBatch(**{**vars(batch), "forward_mode": ForwardMode.EXTEND})
    assert setup.backend.bind_forward(q, k, v, torch.empty_like(q), 0, extend) is None


OPTIONAL_BACKENDS = [
    ("flashinfer", "flashinfer", ("attention.flashinfer_backend", "kernels.flashinfer.decode_attention")),
    (
        "triton",
        "triton",
        ("attention.triton_backend", "kernels.triton.decode_attention", "kernels.triton.extend_attention"),
    ),
]
NEEDS = {
    "flashinfer": "the flashinfer-python package (flashinfer is not installed)",
    "triton": "the triton package (CUDA builds of torch ship it)",
}


@pytest.mark.parametrize(("name", "package", "modules"), OPTIONAL_BACKENDS)
def test_an_optional_backend_without_its_package_is_one_error_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, name: str, package: str, modules: tuple[str, ...]
) -> None:
    # Absent, whether or not this machine has it, and the engine's modules on it imported afresh.
    monkeypatch.setitem(sys.modules, package, None)
    for module in modules:
        monkeypatch.delitem(sys.modules, f"cudagraph.engine.{module}", raising=False)
    shape = type("Shape", (), {"num_heads": 2, "num_kv_heads": 1, "head_dim": 16, "attention_scale": None})()
    req_pool = ReqToTokenPool(2, 8, "cpu")
    kv_pool = TokenToKVPool(8, 1, 1, 16, torch.float32, "cpu")
    with pytest.raises(AttentionBackendUnavailableError) as raised:
        make_attention_backend(name, req_pool, kv_pool, shape)
    assert str(raised.value) == (
        f"the {name} attention backend needs {NEEDS[name]}: pip install 'cudagraph-engine[{name}]', "
        "or use --attention-backend torch"
    )
