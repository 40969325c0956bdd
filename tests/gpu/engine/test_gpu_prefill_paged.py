"""Extend attention and prefill graphs (FlashInfer and Triton attention), and graphs over a paged KV cache (page
sizes 1 and 16), on a GPU.

- FlashInfer's and Triton's extend attention against the torch backend's, one attention call over the very same
  cache: requests of mixed lengths whose cached prefixes end inside a page, on a page boundary, or cross several
  pages.
- Prefill ``full`` (attention inside the graph) with Triton attention against eager for several token counts and
  request counts, prefixes included; batches beyond the captured shapes run eagerly; whole generate loops with
  prefill ``full`` or breakable graphs give eager's tokens. FlashInfer's prefill ``full`` is one clear error.
- Breakable prefill with FlashInfer against FlashInfer eager (the attention break plans the real requests only).
- Decode graphs (full, breakable) over 16-token pages give eager's tokens at every batch size 1..64 (torch backend,
  float32), and FlashInfer decode graphs over 16-token pages match FlashInfer eager at every batch size.

bfloat16 comparisons use ``BF16_LOGITS`` and, where greedy tokens are compared, the same argmax. FlashInfer's graph
plan fixes its query tiling from the bucket while an eager plan picks it from the batch, so graph and eager logits of
FlashInfer prefill may differ by bfloat16 rounding, not more.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator

import pytest
import torch
from test_gpu_engine_graphs import EAGER, assert_decode_replay_matches_eager, config, random_qkv, replayed_batch_sizes

from cudagraph.backend_utils import ForwardContext, set_forward_context
from cudagraph.config import Backend, ConfigError, CudaGraphConfig
from cudagraph.engine.attention import TorchAttentionBackend, make_attention_backend, unified_attention
from cudagraph.engine.batch import Request, SamplingParams, make_decode_batch, make_extend_batch
from cudagraph.engine.generate import generate
from cudagraph.engine.model import ModelConfig, model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.runner import ForwardBatch

pytestmark = pytest.mark.gpu

BF16_LOGITS = {"rtol": 2e-2, "atol": 2e-2}
NO_FLASHINFER = importlib.util.find_spec("flashinfer") is None
needs_flashinfer = pytest.mark.skipif(
    NO_FLASHINFER,
    reason=(
        "flashinfer is not installed: pip install flashinfer-python into the GPU interpreter (or "
        "put its wheels in .whl/, which `nox -s gpu` unpacks)"
    ),
)
# FlashInfer's kernels are built for head dims 64, 128 and 256; the tiny presets use 32.
FLASHINFER_MODEL = model_config_from_preset("tiny-qwen3-random").with_overrides(head_dim=64)
PAGE_SIZES = [1, 16]


@contextlib.contextmanager
def engine(
    preset: str | ModelConfig,
    graphs: CudaGraphConfig,
    *,
    page_size: int,
    attention: str = "torch",
    dtype: str = "float32",
    kernels: str = "auto",
) -> Iterator[ModelRunner]:
    """A CUDA engine with random weights, a cache of ``page_size`` pages and its graphs captured; shut down on exit."""
    model_config = model_config_from_preset(preset) if isinstance(preset, str) else preset
    model = random_model(model_config, seed=3, dtype=dtype, device="cuda")
    cache = CacheConfig(max_num_reqs=80, max_context_len=320, page_size=page_size)
    runner = ModelRunner(model, graphs, cache_config=cache, attention_backend=attention, kernel_backend=kernels)
    try:
        runner.init_cuda_graphs()
        yield runner
    finally:
        runner.shutdown()


def fill_cache(model_runner: ModelRunner, seed: int) -> None:
    """Random keys and values in every slot (stand-ins for cached prefixes), the same for a given seed."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    for buffer in model_runner.token_to_kv_pool.kv_buffer:
        buffer.copy_(torch.randn(buffer.shape, generator=generator, device="cuda"))


def admit_extend(model_runner: ModelRunner, prefix_and_new: list[tuple[int, int]], seed: int) -> list[Request]:
    """One request per ``(prefix, new)``: ``prefix`` tokens counted as cached (whatever KV their slots hold), ``new``
    tokens to extend. ``release`` gives rows and slots back."""
    generator = torch.Generator().manual_seed(seed)
    requests = []
    for index, (prefix, new) in enumerate(prefix_and_new):
        tokens = torch.randint(0, 512, (prefix + new,), generator=generator).tolist()
        requests.append(model_runner.hold(Request(index, tokens, SamplingParams(1), cached_len=prefix)))
    return requests


def release(model_runner: ModelRunner, requests: list[Request]) -> None:
    for request in requests:
        assert request.kv_slots is not None
        model_runner.token_to_kv_pool.free(request.kv_slots)
        model_runner.req_to_token_pool.free(request.req_pool_index)


def attention_output(
    attn_backend: TorchAttentionBackend, q: torch.Tensor, layer_id: int, batch: ForwardBatch
) -> torch.Tensor:
    """One call of the registered attention op, keys and values already stored, as the model makes it."""
    attn_backend.init_forward_metadata(batch)
    output = torch.full_like(q, float("nan"))
    with set_forward_context(ForwardContext(forward_batch=batch, attn_backend=attn_backend)):
        unified_attention(q, q, q, output, layer_id, kv_stored=True)
    return output


# Prefixes that end inside a page, on a page boundary (16, 32) and cross several pages; a request with no prefix,
# a single new token, and new tokens that themselves cross a page boundary.
MIXED_EXTENDS = [(0, 5), (15, 3), (16, 1), (17, 40), (31, 2), (100, 20), (0, 33), (64, 64)]


EXTEND_BACKENDS = [pytest.param("flashinfer", marks=needs_flashinfer), pytest.param("triton")]


@pytest.mark.parametrize("attention", EXTEND_BACKENDS)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_extend_matches_torch_extend_on_one_layer(page_size: int, attention: str) -> None:
    with engine(FLASHINFER_MODEL, EAGER, page_size=page_size, attention=attention, dtype="bfloat16") as flash:
        fill_cache(flash, seed=21)
        shape = flash.shape
        torch_attention = make_attention_backend("torch", flash.req_to_token_pool, flash.token_to_kv_pool, shape)
        requests = admit_extend(flash, MIXED_EXTENDS, seed=page_size)
        batch = make_extend_batch(requests, flash.device)
        q, k, v = random_qkv(shape, batch.num_tokens, seed=page_size)
        layer_id = shape.num_layers - 1
        torch_attention.store_kv(k, v, layer_id, batch.out_cache_loc)
        want = attention_output(torch_attention, q, layer_id, batch)
        have = attention_output(flash.attn_backend, q, layer_id, batch)
        assert not have.isnan().any(), "every new token's output row must be written"
        torch.testing.assert_close(have, want, **BF16_LOGITS)
        release(flash, requests)


# (prefix, new) per request: token counts across several buckets, 1 to 24 requests, prefixes crossing pages.
PREFILL_CASES = [
    [(0, 5)],
    [(0, 16)],
    [(20, 3), (0, 30), (7, 9)],
    [(0, 100), (33, 2), (0, 40), (15, 1)],
    [(0, 150), (150, 150), (0, 150)],
    [(i % 3 * 17, 1 + i % 5) for i in range(24)],
]


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_triton_prefill_full_matches_eager_and_runs_batches_beyond_its_shapes_eagerly(page_size: int) -> None:
    """Prefill ``full`` with Triton attention: attention and its per-token rows are inside each token bucket's graph,
    and a replay gives eager's logits (float32) for every case; a batch past the largest bucket runs eagerly."""
    graphs = config(Backend.DISABLED, Backend.FULL)
    with engine(FLASHINFER_MODEL, graphs, page_size=page_size, attention="triton", dtype="float32") as model_runner:
        runner = model_runner.prefill_cuda_graph_runner
        assert runner is not None and runner.attention_in_graph and runner.captured
        fill_cache(model_runner, seed=9)
        for case, prefix_and_new in enumerate(PREFILL_CASES):
            requests = admit_extend(model_runner, prefix_and_new, seed=case)
            batch = make_extend_batch(requests, model_runner.device)
            assert runner.can_run(batch), f"case {case}: {batch.num_tokens} tokens should replay a graph"
            replayed = runner.replay(batch).clone()
            torch.testing.assert_close(replayed, model_runner.forward(batch), rtol=1e-4, atol=1e-4, msg=f"case {case}")
            release(model_runner, requests)
        requests = admit_extend(model_runner, [(0, 300), (10, 250)], seed=99)
        batch = make_extend_batch(requests, model_runner.device)
        assert not runner.can_run(batch)
        torch.testing.assert_close(runner.replay(batch), model_runner.forward(batch), rtol=0, atol=0)
        release(model_runner, requests)


@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_triton_prefill_graphs_then_decode_give_eager_tokens(page_size: int, backend: Backend) -> None:
    """Whole generate loops with Triton attention and the Triton kernel set (float32): prefill graphs of
    ``backend`` and full decode graphs give eager's tokens."""
    generator = torch.Generator().manual_seed(page_size)
    prompts = [torch.randint(0, 512, (int(n),), generator=generator).tolist() for n in torch.randint(2, 60, (20,))]
    params = [SamplingParams(max_new_tokens=1 + i % 7) for i in range(20)]
    runs = {}
    for name, graphs in (("eager", EAGER), ("graphs", config(Backend.FULL, backend))):
        with engine(FLASHINFER_MODEL, graphs, page_size=page_size, attention="triton", dtype="float32") as model_runner:
            outputs = generate(model_runner, prompts, params, max_prefill_tokens=128)
            runs[name] = [output.output_token_ids for output in outputs]
    assert runs["graphs"] == runs["eager"]


@needs_flashinfer
def test_prefill_full_with_flashinfer_is_one_clear_error_until_its_capture_is_proven() -> None:
    graphs = config(Backend.DISABLED, Backend.FULL)
    message = r"prefill CUDA-graph backend 'full'.*'flashinfer'.*breakable"
    with (
        pytest.raises(ConfigError, match=message),
        engine(FLASHINFER_MODEL, graphs, page_size=16, attention="flashinfer", dtype="bfloat16"),
    ):
        pass


@needs_flashinfer
@pytest.mark.parametrize("backend", [Backend.BREAKABLE, Backend.TC_PIECEWISE])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_flashinfer_prefill_graphs_then_decode_give_eager_tokens(page_size: int, backend: Backend) -> None:
    """Whole generate loops (prefill graphs of ``backend``, decode full graphs) against FlashInfer eager.

    Both runs use the torch kernel set, asked for by name: the fused sets (FlashInfer's, and Triton's, which a
    compiled forward would take by default) round bfloat16 differently (compared on their own in
    test_gpu_fused_kernels), which would flip near-tie tokens of a random-weight model and hide what this test
    compares, graphs against eager."""
    generator = torch.Generator().manual_seed(page_size)
    prompts = [torch.randint(0, 512, (int(n),), generator=generator).tolist() for n in torch.randint(2, 60, (20,))]
    params = [SamplingParams(max_new_tokens=1 + i % 7) for i in range(20)]
    runs = {}
    for name, graphs in (("eager", EAGER), ("graphs", config(Backend.FULL, backend))):
        with engine(
            FLASHINFER_MODEL, graphs, page_size=page_size, attention="flashinfer", dtype="bfloat16", kernels="torch"
        ) as flash:
            outputs = generate(flash, prompts, params, max_prefill_tokens=128)
            runs[name] = [output.output_token_ids for output in outputs]
    assert runs["graphs"] == runs["eager"]


@needs_flashinfer
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_breakable_flashinfer_prefill_matches_eager_exactly(page_size: int) -> None:
    """The attention break plans the eager wrapper for the real requests only: the same kernels on the same inputs."""
    graphs = config(Backend.DISABLED, Backend.BREAKABLE)
    with engine(FLASHINFER_MODEL, graphs, page_size=page_size, attention="flashinfer", dtype="bfloat16") as flash:
        runner = flash.prefill_cuda_graph_runner
        assert runner is not None and not runner.attention_in_graph
        fill_cache(flash, seed=8)
        for case, prefix_and_new in enumerate(PREFILL_CASES):
            requests = admit_extend(flash, prefix_and_new, seed=case)
            batch = make_extend_batch(requests, flash.device)
            replayed = runner.replay(batch).clone()
            torch.testing.assert_close(replayed, flash.forward(batch), **BF16_LOGITS, msg=f"case {case}")
            release(flash, requests)


def shrinking_workload(count: int = 65, seed: int = 0) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompt ``i`` wants ``i + 1`` tokens, so the decode batch walks down through every size from 64 to 1."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 40, (count,), generator=generator).tolist()
    prompts = [torch.randint(0, 512, (n,), generator=generator).tolist() for n in lengths]
    return prompts, [SamplingParams(max_new_tokens=i + 1) for i in range(count)]


@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE])
def test_decode_graphs_over_16_token_pages_give_eager_tokens_at_every_batch_size(backend: Backend) -> None:
    prompts, params = shrinking_workload()
    with engine("tiny-qwen3-random", EAGER, page_size=1) as eager:
        expected = [o.output_token_ids for o in generate(eager, prompts, params)]
    with engine("tiny-qwen3-random", config(backend, Backend.DISABLED), page_size=16) as graphed:
        runner = graphed.decode_cuda_graph_runner
        assert runner is not None
        got = [o.output_token_ids for o in generate(graphed, prompts, params)]
        seen = replayed_batch_sizes(runner)
    assert seen == list(range(1, 65)), "every decode batch size 1..64 should have replayed a graph"
    for index, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert have == want, f"prompt {index} diverged"


@needs_flashinfer
@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE])
def test_flashinfer_decode_graphs_over_16_token_pages_match_eager_at_every_batch_size(backend: Backend) -> None:
    graphs = config(backend, Backend.DISABLED)
    with engine(FLASHINFER_MODEL, graphs, page_size=16, attention="flashinfer", dtype="bfloat16") as flash:
        fill_cache(flash, seed=12)
        generator = torch.Generator().manual_seed(12)
        for batch_size in range(1, 65):
            cached = torch.randint(0, 150, (batch_size,), generator=generator).tolist()
            # Every token but the last is cached: a decode step over pages.
            requests = admit_extend(flash, [(n, 1) for n in cached], seed=batch_size)
            batch = make_decode_batch(requests, flash.device)
            assert_decode_replay_matches_eager(flash, batch)
            release(flash, requests)
