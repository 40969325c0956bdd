"""Graphs against eager on a real GPU: decode (full, breakable) for every batch size 1..64, prefill (breakable),
and the FlashInfer attention backend against the torch one.

Random-weight float32 models keep greedy ties out of the comparison: a graph must reproduce eager tokens exactly.
Every engine is shut down even when a test fails, so a failure never leaves a graph pool behind for the next test.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator

import pytest
import torch

from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
from cudagraph.engine.batch import Request, SamplingParams, make_extend_batch
from cudagraph.engine.benchmark import release_synthetic_batch, synthetic_decode_batch
from cudagraph.engine.generate import generate
from cudagraph.engine.model import ModelConfig, model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner

BF16_LOGITS = {"rtol": 2e-2, "atol": 2e-2}
"""How close two bfloat16 logits must be: the torch backend's graph against its eager run, and FlashInfer against
the torch backend (both graphed and eager), so no FlashInfer test is looser than the torch backend's own."""

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
    preset: str | ModelConfig, graphs: CudaGraphConfig, attention: str = "torch", dtype: str = "float32"
) -> Iterator[ModelRunner]:
    """A CUDA engine with random weights and its graphs captured; shut down on exit, pass or fail."""
    model_config = model_config_from_preset(preset) if isinstance(preset, str) else preset
    model = random_model(model_config, seed=3, dtype=dtype, device="cuda")
    cache = CacheConfig(max_num_reqs=80, max_context_len=160)
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


def count_replayed_batch_sizes(runner) -> list[int]:
    seen: list[int] = []
    replay = runner.replay

    def counting(batch):
        if runner.can_run(batch):
            seen.append(batch.batch_size)
        return replay(batch)

    runner.replay = counting
    return seen


def tokens(model_runner: ModelRunner, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    return [output.output_token_ids for output in generate(model_runner, prompts, params)]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE])
@pytest.mark.parametrize("preset", ["tiny-qwen3-random", "tiny-llama-random"])
def test_decode_graphs_give_eager_tokens_at_every_batch_size(preset: str, backend: Backend) -> None:
    prompts, params = shrinking_workload()
    with engine(preset, EAGER) as eager:
        expected = tokens(eager, prompts, params)
    with engine(preset, config(backend, Backend.DISABLED)) as graphed:
        assert graphed.decode_cuda_graph_runner is not None and graphed.decode_cuda_graph_runner.stats.graphs == 9
        seen = count_replayed_batch_sizes(graphed.decode_cuda_graph_runner)
        got = tokens(graphed, prompts, params)
    assert sorted(set(seen)) == list(range(1, 65)), "every decode batch size 1..64 should have replayed a graph"
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
                request = Request(index, prompt, SamplingParams(1))
                request.req_pool_index = graphed.req_to_token_pool.alloc()
                request.kv_slots = graphed.token_to_kv_pool.alloc(request.budget)
                graphed.req_to_token_pool.write(request.req_pool_index, 0, request.kv_slots)
                requests.append(request)
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


@pytest.mark.gpu
@pytest.mark.skipif(NO_FLASHINFER, reason="flashinfer is not installed (carry .whl)")
@pytest.mark.parametrize("backend", [Backend.DISABLED, Backend.FULL, Backend.BREAKABLE])
def test_flashinfer_decode_logits_match_the_torch_backend(backend: Backend) -> None:
    with (
        engine(FLASHINFER_MODEL, EAGER, dtype="bfloat16") as reference,
        engine(FLASHINFER_MODEL, config(backend, Backend.DISABLED), attention="flashinfer", dtype="bfloat16") as flash,
    ):
        for model_runner in (reference, flash):
            fill_cache(model_runner, seed=9)
        for batch_size in (1, 3, 16, 40):
            # Both engines allocate the same rows and slots, so both attend over the same random keys and values.
            reference_batch = synthetic_decode_batch(reference, batch_size, context_len=70, seed=batch_size)
            flash_batch = synthetic_decode_batch(flash, batch_size, context_len=70, seed=batch_size)
            assert torch.equal(reference_batch.out_cache_loc, flash_batch.out_cache_loc)
            want = reference.forward(reference_batch)
            have = flash.run(flash_batch)
            torch.testing.assert_close(have, want, **BF16_LOGITS)
            release_synthetic_batch(reference, reference_batch, 70)
            release_synthetic_batch(flash, flash_batch, 70)


@pytest.mark.gpu
@pytest.mark.skipif(NO_FLASHINFER, reason="flashinfer is not installed (carry .whl)")
@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE])
def test_flashinfer_decode_graphs_match_flashinfer_eager_at_every_batch_size(backend: Backend) -> None:
    """bfloat16 rules out exact tokens, so compare logits: every batch size 1..64, padding included."""
    with engine(FLASHINFER_MODEL, config(backend, Backend.DISABLED), attention="flashinfer", dtype="bfloat16") as flash:
        fill_cache(flash, seed=11)
        runner = flash.decode_cuda_graph_runner
        assert runner is not None
        for batch_size in range(1, 65):
            batch = synthetic_decode_batch(flash, batch_size, context_len=50, seed=batch_size)
            assert runner.can_run(batch)
            have = runner.replay(batch).clone()
            want = flash.forward(batch)
            torch.testing.assert_close(have, want, **BF16_LOGITS, msg=f"batch size {batch_size}")
            release_synthetic_batch(flash, batch, 50)
