"""The continuous-batching generate loop on the CPU (eager): greedy equals the dense no-cache reference."""

from __future__ import annotations

import copy

import pytest
import torch

from cudagraph.config import Backend, ConfigError, CudaGraphConfig, PhaseConfig
from cudagraph.engine.batch import SamplingParams
from cudagraph.engine.generate import generate
from cudagraph.engine.kv_cache import CacheFullError
from cudagraph.engine.model import model_config_from_preset, random_model, reference_greedy
from cudagraph.engine.model_runner import CacheConfig, ModelRunner

EAGER = CudaGraphConfig(decode=PhaseConfig(Backend.DISABLED, (), 0), prefill=PhaseConfig(Backend.DISABLED, (), 0))


def engine(preset: str, max_num_reqs: int = 4, num_kv_slots: int | None = None) -> ModelRunner:
    model = random_model(model_config_from_preset(preset), seed=1, dtype="float32", device="cpu")
    cache = CacheConfig(max_num_reqs=max_num_reqs, max_context_len=48, num_kv_slots=num_kv_slots)
    return ModelRunner(model, EAGER, cache_config=cache)


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (int(n),), generator=generator).tolist() for n in torch.randint(1, 20, (count,))]


@pytest.mark.parametrize("preset", ["tiny-qwen3-random", "tiny-llama-random"])
def test_greedy_matches_the_dense_reference_while_requests_join_and_leave(preset: str) -> None:
    # Four request rows for nine prompts: later prompts join as earlier ones finish.
    runner = engine(preset)
    batch = prompts(9, seed=2)
    lengths = [3, 11, 6, 1, 9, 4, 7, 2, 5]
    params = [SamplingParams(max_new_tokens=n) for n in lengths]
    outputs = generate(runner, batch, params, max_prefill_tokens=24)
    for prompt, param, output in zip(batch, params, outputs, strict=True):
        assert output.output_token_ids == reference_greedy(runner.model, prompt, param.max_new_tokens)
    # Everything was given back.
    assert runner.req_to_token_pool.available == 4
    assert runner.token_to_kv_pool.available == runner.cache_config.resolved_slots()


def test_temperature_sampling_is_seeded_and_differs_from_greedy() -> None:
    runner = engine("tiny-qwen3-random")
    batch = prompts(3, seed=5)
    hot = SamplingParams(max_new_tokens=12, temperature=5.0, seed=11)
    first = generate(runner, batch, hot)
    again = generate(runner, batch, hot)
    greedy = generate(runner, batch, SamplingParams(max_new_tokens=12))
    assert [o.output_token_ids for o in first] == [o.output_token_ids for o in again]
    assert [o.output_token_ids for o in first] != [o.output_token_ids for o in greedy]


def test_stop_tokens_end_a_request_early() -> None:
    runner = engine("tiny-qwen3-random")
    prompt = prompts(1, seed=3)
    free_run = generate(runner, prompt, SamplingParams(max_new_tokens=8))[0].output_token_ids
    stop = free_run[2]
    stopped = generate(runner, prompt, SamplingParams(max_new_tokens=8, stop_token_ids=(stop,)))[0].output_token_ids
    assert stopped == free_run[: free_run.index(stop) + 1]


def test_prompts_that_cannot_fit_are_rejected_with_the_reason() -> None:
    runner = engine("tiny-qwen3-random")
    with pytest.raises(CacheFullError, match="max_context_len is 48"):
        generate(runner, [[1] * 40], SamplingParams(max_new_tokens=10))
    with pytest.raises(ValueError, match="at least one token"):
        generate(runner, [[]], SamplingParams(max_new_tokens=2))
    small = engine("tiny-qwen3-random", num_kv_slots=8)
    with pytest.raises(CacheFullError, match="does not fit an empty KV cache"):
        generate(small, [[1] * 10], SamplingParams(max_new_tokens=2))


@pytest.mark.parametrize("page_size", [16, 4])
def test_paged_cache_gives_the_tokens_of_one_slot_pages(page_size: int) -> None:
    """Requests join and leave a cache of pages: the torch backend gathers by slot, so tokens match page size 1."""
    model = random_model(model_config_from_preset("tiny-qwen3-random"), seed=1, dtype="float32", device="cpu")
    batch = prompts(7, seed=6)
    params = [SamplingParams(max_new_tokens=n) for n in (9, 2, 14, 5, 1, 7, 11)]
    outputs = {}
    for size in (1, page_size):
        runner = ModelRunner(model, EAGER, cache_config=CacheConfig(max_num_reqs=3, max_context_len=48, page_size=size))
        outputs[size] = [o.output_token_ids for o in generate(runner, batch, params, max_prefill_tokens=30)]
        assert runner.token_to_kv_pool.available == runner.cache_config.resolved_slots()
    assert outputs[page_size] == outputs[1]
    assert outputs[1][0] == reference_greedy(model, batch[0], 9)


def test_prefill_full_with_torch_attention_is_one_error_naming_what_works() -> None:
    model = random_model(model_config_from_preset("tiny-qwen3-random"), seed=1, dtype="float32", device="cpu")
    config = CudaGraphConfig(decode=PhaseConfig(Backend.DISABLED, (), 0), prefill=PhaseConfig(Backend.FULL, (16,), 16))
    with pytest.raises(ConfigError, match=r"prefill CUDA-graph backend 'full'.*--prefill-cuda-graph-backend breakable"):
        ModelRunner(model, config, attention_backend="torch")


def test_a_config_the_engine_was_not_built_with_is_checked_and_gets_its_kernels() -> None:
    """A benchmark builds runners of other configs over one eager engine: the engine checks each (prefill ``full``
    with torch attention is refused, as at construction) and hands it the kernel set it would pick, switchable back."""
    runner = engine("tiny-qwen3-random")
    prefill_full = CudaGraphConfig(
        decode=PhaseConfig(Backend.DISABLED, (), 0), prefill=PhaseConfig(Backend.FULL, (16,), 16)
    )
    with pytest.raises(ConfigError, match=r"prefill CUDA-graph backend 'full'.*'torch' attention backend"):
        runner.check_graph_config(prefill_full)
    runner.check_graph_config(EAGER)
    built_with = runner.kernels
    traced = runner.kernels_for(
        CudaGraphConfig(decode=PhaseConfig(Backend.TC_PIECEWISE, (1,), 1), prefill=PhaseConfig(Backend.DISABLED, (), 0))
    )
    assert traced.name == "torch"
    other = copy.copy(built_with)
    runner.use_kernels(other)
    assert runner.kernels is other and runner.model.kernels is other
    runner.use_kernels(built_with)
    assert runner.model.kernels is built_with
