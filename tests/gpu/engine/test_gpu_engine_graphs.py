"""Graphs against eager on a real GPU: decode (full, breakable) for every batch size 1..64, prefill (breakable),
and the FlashInfer and Triton decode attention against the torch backend's.

Random-weight float32 models keep greedy ties out of the comparison: a graph must reproduce eager tokens exactly.
The bfloat16 tests compare logits (or attention outputs) at ``BF16_LOGITS``, each where that claim holds:

- graphs against eager of the same attention backend (torch, FlashInfer), whole model: the same kernels on the same
  inputs, so only what a graph changes (padding, static buffers, replay) can make them differ;
- FlashInfer against torch attention, one attention call: the same ``q`` over the same paged keys and values.

There is deliberately no whole-model FlashInfer-against-torch comparison. Two different attention kernels round
differently in bfloat16 (by one bfloat16 step here and there); each layer feeds that into the next layer and finally
the LM head, so whole-model logits of the two backends drift past the tolerance (measured on an H100, eager against
eager: 13 of 512 logits, by up to 0.05) while every single attention call agrees well within it (at most 0.008). The
op-level test is where the kernels are compared; the graph tests compare each backend only with itself.

Every engine is shut down even when a test fails, so a failure never leaves a graph pool behind for the next test.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator

import pytest
import torch

from cudagraph.backend_utils import ForwardContext, set_forward_context
from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
from cudagraph.engine.attention import TorchAttentionBackend, make_attention_backend, unified_attention
from cudagraph.engine.batch import Request, SamplingParams, make_extend_batch
from cudagraph.engine.generate import generate
from cudagraph.engine.model import ModelConfig, model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner, ModelShape
from cudagraph.engine.testing import release_synthetic_batch, synthetic_decode_batch
from cudagraph.runner import ForwardBatch, ForwardMode

BF16_LOGITS = {"rtol": 2e-2, "atol": 2e-2}
"""How close two bfloat16 results must be: a graph's logits against eager logits of the same backend (torch or
FlashInfer), and FlashInfer's attention output against the torch backend's for one call, so no FlashInfer test is
looser than the torch backend's own."""

DECODE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64)
PREFILL_BUCKETS = (16, 32, 64, 128, 256, 512)


def config(decode: Backend, prefill: Backend) -> CudaGraphConfig:
    return CudaGraphConfig(
        decode=PhaseConfig(decode, () if decode is Backend.DISABLED else DECODE_BUCKETS, 64),
        prefill=PhaseConfig(prefill, () if prefill is Backend.DISABLED else PREFILL_BUCKETS, 512),
    )


EAGER = config(Backend.DISABLED, Backend.DISABLED)


@contextlib.contextmanager
def engine(
    preset: str | ModelConfig,
    graphs: CudaGraphConfig,
    attention: str = "torch",
    dtype: str = "float32",
    cache: CacheConfig | None = None,
) -> Iterator[ModelRunner]:
    """A CUDA engine with random weights and its graphs captured; shut down on exit, pass or fail."""
    model_config = model_config_from_preset(preset) if isinstance(preset, str) else preset
    model = random_model(model_config, seed=3, dtype=dtype, device="cuda")
    cache = cache or CacheConfig(max_num_reqs=80, max_context_len=160)
    runner = ModelRunner(model, graphs, cache_config=cache, attention_backend=attention)
    try:
        runner.init_cuda_graphs()
        yield runner
    finally:
        runner.shutdown()


def shrinking_workload(count: int = 65, seed: int = 0) -> tuple[list[list[int]], list[SamplingParams]]:
    """``count`` prompts; prompt ``i`` wants ``i + 1`` tokens. Prefill gives every prompt its first token, so the
    decode batch then walks down through every size from ``count - 1`` to 1."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 24, (count,), generator=generator).tolist()
    prompts = [torch.randint(0, 512, (n,), generator=generator).tolist() for n in lengths]
    return prompts, [SamplingParams(max_new_tokens=i + 1) for i in range(count)]


def fill_cache(model_runner: ModelRunner, seed: int) -> None:
    """Random keys and values in every slot, the same for every engine given the same seed."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    for buffer in model_runner.token_to_kv_pool.kv_buffer:
        buffer.copy_(torch.randn(buffer.shape, generator=generator, device="cuda"))


def replayed_batch_sizes(runner) -> list[int]:
    """The batch sizes that replayed a graph so far, ascending (from the runner's replay metrics)."""
    return [size for size, count in enumerate(runner.metrics.replays_by_size) if count]


def tokens(model_runner: ModelRunner, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    return [output.output_token_ids for output in generate(model_runner, prompts, params)]


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["torch", "triton"])
@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE])
@pytest.mark.parametrize("preset", ["tiny-qwen3-random", "tiny-llama-random"])
def test_decode_graphs_give_eager_tokens_at_every_batch_size(preset: str, backend: Backend, attention: str) -> None:
    prompts, params = shrinking_workload()
    with engine(preset, EAGER, attention=attention) as eager:
        expected = tokens(eager, prompts, params)
    with engine(preset, config(backend, Backend.DISABLED), attention=attention) as graphed:
        assert graphed.decode_cuda_graph_runner is not None and graphed.decode_cuda_graph_runner.stats.graphs == 9
        got = tokens(graphed, prompts, params)
        seen = replayed_batch_sizes(graphed.decode_cuda_graph_runner)
    assert seen == list(range(1, 65)), "every decode batch size 1..64 should have replayed a graph"
    for index, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert have == want, f"prompt {index} diverged"


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["tiny-qwen3-random", "tiny-llama-random"])
def test_breakable_prefill_matches_eager_prefill(preset: str) -> None:
    with engine(preset, config(Backend.DISABLED, Backend.BREAKABLE)) as graphed:
        runner = graphed.prefill_cuda_graph_runner
        assert runner is not None and runner.stats.graphs == len(PREFILL_BUCKETS)
        generator = torch.Generator().manual_seed(1)
        for lengths in ([5], [16], [3, 30, 9], [100, 2, 40, 1], [150, 150, 150]):
            requests = []
            for index, length in enumerate(lengths):
                prompt = torch.randint(0, 512, (length,), generator=generator).tolist()
                requests.append(graphed.hold(Request(index, prompt, SamplingParams(1))))
            batch = make_extend_batch(requests, graphed.device)
            assert runner.can_run(batch)
            replayed = runner.replay(batch).clone()
            eager = graphed.forward(batch)
            torch.testing.assert_close(replayed, eager, rtol=1e-4, atol=1e-4)
            assert torch.equal(replayed.argmax(-1), eager.argmax(-1))
            for request in requests:
                graphed.token_to_kv_pool.free(request.kv_slots)
                graphed.req_to_token_pool.free(request.req_pool_index)


@pytest.mark.gpu
def test_default_graphs_both_phases_give_eager_tokens() -> None:
    prompts, params = shrinking_workload(count=48, seed=4)
    with engine("tiny-qwen3-random", EAGER) as eager:
        expected = tokens(eager, prompts, params)
    with engine("tiny-qwen3-random", config(Backend.FULL, Backend.BREAKABLE)) as graphed:
        got = [o.output_token_ids for o in generate(graphed, prompts, params, max_prefill_tokens=200)]
    assert got == expected


@pytest.mark.gpu
def test_graph_replay_in_bfloat16_matches_eager_logits_closely() -> None:
    """The benchmark's dtype: a full-graph replay stays within bf16 rounding of eager."""
    with engine("tiny-qwen3-random", config(Backend.FULL, Backend.DISABLED), dtype="bfloat16") as graphed:
        fill_cache(graphed, seed=5)
        runner = graphed.decode_cuda_graph_runner
        for batch_size in (1, 5, 16):
            batch = synthetic_decode_batch(graphed, batch_size, context_len=40, seed=batch_size)
            want = graphed.forward(batch).clone()
            have = runner.replay(batch)
            torch.testing.assert_close(have, want, **BF16_LOGITS)
            release_synthetic_batch(graphed, batch, 40)


NO_FLASHINFER = importlib.util.find_spec("flashinfer") is None
# FlashInfer's decode kernels are built for head dims 64, 128 and 256; the tiny presets use 32.
FLASHINFER_MODEL = model_config_from_preset("tiny-qwen3-random").with_overrides(head_dim=64)


def decode_batch_of_lengths(model_runner: ModelRunner, context_lens: list[int], seed: int) -> ForwardBatch:
    """One fresh request per entry of ``context_lens``, with that many cached tokens (whatever KV is in their slots),
    decoding its next token. ``release_decode_batch`` gives the rows and slots back."""
    device = model_runner.device
    rows, new_token_slots = [], []
    for context_len in context_lens:
        row = model_runner.req_to_token_pool.alloc()
        slots = model_runner.token_to_kv_pool.alloc(context_len + 1)
        model_runner.req_to_token_pool.write(row, 0, slots)
        rows.append(row)
        new_token_slots.append(slots[context_len])
    generator = torch.Generator().manual_seed(seed)
    vocab = model_runner.model.config.vocab_size
    seq_lens_cpu = torch.tensor(context_lens, dtype=torch.int32) + 1
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=len(context_lens),
        input_ids=torch.randint(0, vocab, (len(context_lens),), generator=generator).to(device),
        positions=torch.tensor(context_lens, dtype=torch.int64, device=device),
        seq_lens=seq_lens_cpu.to(device),
        req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=device),
        out_cache_loc=torch.stack(new_token_slots).to(device),
        seq_lens_sum=int(seq_lens_cpu.sum()),
        seq_lens_cpu=seq_lens_cpu,
    )


def release_decode_batch(model_runner: ModelRunner, batch: ForwardBatch) -> None:
    """Give back the rows and slots ``decode_batch_of_lengths`` took."""
    assert batch.seq_lens_cpu is not None
    for row, seq_len in zip(batch.req_pool_indices.tolist(), batch.seq_lens_cpu.tolist(), strict=True):
        slots = model_runner.req_to_token_pool.req_to_token[row, :seq_len].to("cpu", torch.int64)
        model_runner.token_to_kv_pool.free(slots)
        model_runner.req_to_token_pool.free(row)


def random_qkv(shape: ModelShape, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random bfloat16 query, key and value rows (``rows`` tokens) for an engine's attention ``shape``, drawn in that
    order from one CUDA generator seeded with ``seed``."""
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def activations(heads: int) -> torch.Tensor:
        return torch.randn(rows, heads * shape.head_dim, generator=generator, device="cuda").to(torch.bfloat16)

    return activations(shape.num_heads), activations(shape.num_kv_heads), activations(shape.num_kv_heads)


def mixed_length_decode_batches(model_runner: ModelRunner, seed: int) -> Iterator[ForwardBatch]:
    """A decode batch of every size 1..64 (padding included) over requests of random context lengths (0 to 149,
    drawn from ``seed``), each released once the caller has taken its turn with it."""
    generator = torch.Generator().manual_seed(seed)
    for batch_size in range(1, 65):
        context_lens = torch.randint(0, 150, (batch_size,), generator=generator).tolist()
        batch = decode_batch_of_lengths(model_runner, context_lens, seed=batch_size)
        yield batch
        release_decode_batch(model_runner, batch)


def assert_decode_replay_matches_eager(model_runner: ModelRunner, batch: ForwardBatch) -> None:
    """``batch`` runs on the decode graphs, and their logits are eager's within ``BF16_LOGITS`` with the same greedy
    tokens."""
    runner = model_runner.decode_cuda_graph_runner
    assert runner is not None and runner.can_run(batch)
    have = runner.replay(batch).clone()
    want = model_runner.forward(batch)
    torch.testing.assert_close(have, want, **BF16_LOGITS, msg=f"batch size {batch.batch_size}")
    assert torch.equal(have.argmax(-1), want.argmax(-1)), f"batch size {batch.batch_size}: greedy tokens differ"


def attention_output(
    attn_backend: TorchAttentionBackend,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layer_id: int,
    batch: ForwardBatch,
) -> torch.Tensor:
    """One call of the registered attention op for ``layer_id`` under ``attn_backend``, as the model makes it: the
        step's keys and values are already stored, the op only attends. (FlashInfer's backend is a torch backend whose
    decode goes through FlashInfer.)"""
    attn_backend.init_forward_metadata(batch)
    output = torch.empty_like(q)
    with set_forward_context(ForwardContext(forward_batch=batch, attn_backend=attn_backend)):
        unified_attention(q, k, v, output, layer_id, kv_stored=True)
    return output


def fused_attention_params() -> list:
    """The attention backends with their own decode kernels: FlashInfer's (when installed) and Triton's."""
    skip = pytest.mark.skipif(
        NO_FLASHINFER,
        reason=(
            "flashinfer is not installed: pip install flashinfer-python into the GPU interpreter (or "
            "put its wheels in .whl/, which `nox -s gpu` unpacks)"
        ),
    )
    return [pytest.param("flashinfer", marks=skip), pytest.param("triton")]


@pytest.mark.gpu
@pytest.mark.parametrize("attention", fused_attention_params())
@pytest.mark.parametrize("batch_size", [1, 3, 16, 40])
def test_fused_decode_attention_matches_the_torch_backend_on_one_layer(batch_size: int, attention: str) -> None:
    """One attention call, both backends over the very same cache tensors: requests of different lengths (one of
    them attending only to its own new token), a grouped-query layout, bfloat16 throughout."""
    with engine(FLASHINFER_MODEL, EAGER, attention=attention, dtype="bfloat16") as flash:
        fill_cache(flash, seed=9)
        shape = flash.shape
        assert shape.num_heads > shape.num_kv_heads, "the model should exercise grouped-query attention"
        # The torch backend reads the FlashInfer engine's own pools: same slots, same keys and values, by construction.
        torch_attention = make_attention_backend("torch", flash.req_to_token_pool, flash.token_to_kv_pool, shape)
        generator = torch.Generator().manual_seed(batch_size)
        context_lens = [0, *torch.randint(1, 150, (batch_size - 1,), generator=generator).tolist()]
        batch = decode_batch_of_lengths(flash, context_lens, seed=batch_size)
        q, k, v = random_qkv(shape, batch_size, seed=batch_size)
        layer_id = shape.num_layers - 1
        torch_attention.store_kv(k, v, layer_id, batch.out_cache_loc)
        want = attention_output(torch_attention, q, k, v, layer_id, batch)
        have = attention_output(flash.attn_backend, q, k, v, layer_id, batch)
        assert have.dtype == want.dtype == torch.bfloat16
        torch.testing.assert_close(have, want, **BF16_LOGITS)
        # A row that sees only its new token returns that token's value, in every query head of the group.
        groups = shape.num_heads // shape.num_kv_heads
        only_value = v[0].view(shape.num_kv_heads, 1, shape.head_dim).expand(-1, groups, -1).reshape(-1)
        torch.testing.assert_close(have[0], only_value, **BF16_LOGITS)
        release_decode_batch(flash, batch)


@pytest.mark.gpu
@pytest.mark.parametrize("attention", fused_attention_params())
@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE])
def test_fused_decode_graphs_match_their_eager_at_every_batch_size(backend: Backend, attention: str) -> None:
    """Whole-model logits of a FlashInfer graph against FlashInfer eager: every batch size 1..64, padding included,
    requests of mixed lengths (so each replay re-plans the wrapper for new lengths). bfloat16 logits at
    ``BF16_LOGITS``, and the same greedy tokens, ties included: a graph runs eager's kernels per row (split-kv is off
    for that), and on an H100 every replay here was bitwise equal to eager."""
    with engine(FLASHINFER_MODEL, config(backend, Backend.DISABLED), attention=attention, dtype="bfloat16") as flash:
        fill_cache(flash, seed=11)
        for batch in mixed_length_decode_batches(flash, seed=11):
            assert_decode_replay_matches_eager(flash, batch)


@pytest.mark.gpu
def test_triton_decode_attention_over_long_contexts_matches_the_torch_backend() -> None:
    """Contexts up to 4000 tokens in a 4096-token cache (splits of 256 tokens, merged by the last split to finish),
    one attention call in bfloat16 against the torch backend over the same cache."""
    cache = CacheConfig(max_num_reqs=8, max_context_len=4096)
    with engine(FLASHINFER_MODEL, EAGER, attention="triton", dtype="bfloat16", cache=cache) as runner:
        fill_cache(runner, seed=13)
        kernel = runner.attn_backend.decode_kernel
        assert (kernel.split_tokens, kernel.splits) == (256, 16)
        shape = runner.shape
        torch_attention = make_attention_backend("torch", runner.req_to_token_pool, runner.token_to_kv_pool, shape)
        batch = decode_batch_of_lengths(runner, [4000, 1, 255, 256, 2600, 700], seed=13)
        generator = torch.Generator(device="cuda").manual_seed(13)
        q, k, v = (
            torch.randn(6, heads * shape.head_dim, generator=generator, device="cuda").to(torch.bfloat16)
            for heads in (shape.num_heads, shape.num_kv_heads, shape.num_kv_heads)
        )
        torch_attention.store_kv(k, v, 0, batch.out_cache_loc)
        want = attention_output(torch_attention, q, k, v, 0, batch)
        have = attention_output(runner.attn_backend, q, k, v, 0, batch)
        torch.testing.assert_close(have, want, **BF16_LOGITS)
        assert int(kernel.scratch.arrivals.abs().sum()) == 0
        release_decode_batch(runner, batch)
