"""Sleep mode on a real GPU: graphs captured once replay across 100 sleeps and wakes.

An engine built with ``enable_sleep_mode`` keeps its weights, KV cache and graph pool in memory a sleep unmaps and a
wake maps back at the same virtual addresses (``cudagraph.backend_utils.sleep_memory``, torch-memory-saver). Each
cycle sleeps at a level (0: weights stay; 1: copied to host and back; 2: discarded, then loaded in place as an RL
driver loads new ones), wakes, updates the weights in place, and generates: the greedy tokens must equal an eager
engine's of the same weights living the same life, every graph must be the one captured before the first sleep, and
every sleep must free at least 95 % of what its level gives back. Float32 random weights keep ties out.

Where torch-memory-saver is not installed (it travels as a wheel in ``.whl/``), the file skips with that reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from cudagraph.backend_utils import MemoryTag, sleep_memory_unavailable_reason
from cudagraph.config import Backend, CapturePolicy, CudaGraphConfig, PhaseConfig
from cudagraph.engine.batch import SamplingParams
from cudagraph.engine.generate import generate
from cudagraph.engine.lifecycle import free_device_bytes
from cudagraph.engine.model import model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner

pytestmark = pytest.mark.gpu

PRESET = "tiny-qwen3-random"
DECODE_BUCKETS = (1, 2, 4, 8, 16)
CACHE = CacheConfig(max_num_reqs=24, max_context_len=64, num_kv_slots=262144)
CYCLES = 100
FREED_SHARE = 0.95


@pytest.fixture(autouse=True)
def _sleepable_memory() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (nox -s gpu on a CUDA machine)")
    reason = sleep_memory_unavailable_reason("cuda")
    if reason is not None:
        pytest.skip(reason)


def config(backend: Backend, policy: CapturePolicy = CapturePolicy.EAGER) -> CudaGraphConfig:
    enabled = backend is not Backend.DISABLED
    return CudaGraphConfig(
        decode=PhaseConfig(backend, DECODE_BUCKETS if enabled else (), 16 if enabled else 0, capture_policy=policy),
        prefill=PhaseConfig(Backend.DISABLED, (), 0),
    )


@contextlib.contextmanager
def engine(backend: Backend, *, sleep_mode: bool, policy: CapturePolicy = CapturePolicy.EAGER) -> Iterator[ModelRunner]:
    model = random_model(model_config_from_preset(PRESET), seed=3, dtype="float32", device="cuda")
    runner = ModelRunner(model, config(backend, policy), cache_config=CACHE, enable_sleep_mode=sleep_mode)
    try:
        yield runner
    finally:
        runner.shutdown()


def tokens(model_runner: ModelRunner, seed: int) -> list[list[int]]:
    """Greedy tokens of six prompts wanting 1..6 tokens, so decode walks through batch sizes 5..1."""
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 512, (int(n),), generator=generator).tolist() for n in range(3, 9)]
    params = [SamplingParams(max_new_tokens=i + 1) for i in range(6)]
    return [output.output_token_ids for output in generate(model_runner, prompts, params)]


def scaled_weights(model_runner: ModelRunner, cycle: int) -> dict[str, torch.Tensor]:
    """The first decoder layer's weights scaled a little (the same for every engine given a cycle)."""
    scale = 1.0 + 0.001 * (cycle % 7)
    return {
        name: param.detach() * scale
        for name, param in model_runner.model.named_parameters()
        if ".0." in name and name.endswith("weight")
    }


def graph_ids(model_runner: ModelRunner) -> dict[object, int]:
    runner = model_runner.decode_cuda_graph_runner
    assert runner is not None
    return {key: id(entry) for key, entry in runner.backend.entries.items()}


@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE])
def test_graphs_captured_once_replay_eager_tokens_across_100_sleeps(backend: Backend) -> None:
    with engine(Backend.DISABLED, sleep_mode=False) as eager, engine(backend, sleep_mode=True) as graphed:
        assert graphed.sleep_memory is not None, graphed.sleep_memory_reason
        eager.init_cuda_graphs()
        graphed.init_cuda_graphs()
        assert tokens(graphed, seed=0) == tokens(eager, seed=0)
        captured = graph_ids(graphed)
        assert sorted(key.tokens for key in captured) == list(DECODE_BUCKETS)
        original = {name: param.detach().clone() for name, param in graphed.model.named_parameters()}
        for cycle in range(CYCLES):
            level = cycle % 3
            graphed.sleep(level)
            freed = graphed.memory_levels.freed_by_sleep
            assert freed is not None and freed > 0
            assert graphed.sleep_memory.released == (
                {MemoryTag.GRAPHS, MemoryTag.KV_CACHE} | ({MemoryTag.WEIGHTS} if level else set())
            )
            graphed.wake()
            if level == 2:  # discarded: load them again, in place
                graphed.update_weights(original)
            update = scaled_weights(eager, cycle)
            eager.update_weights(update)
            assert graphed.update_weights(update).recaptured == {"decode": ()}
            if cycle % 10 == 0 or cycle == CYCLES - 1:
                assert tokens(graphed, seed=cycle + 1) == tokens(eager, seed=cycle + 1), f"cycle {cycle}"
        assert graph_ids(graphed) == captured  # the graphs captured before the first sleep, every one


def test_each_level_frees_what_it_gives_back() -> None:
    with engine(Backend.FULL, sleep_mode=True) as graphed:
        before = free_device_bytes(graphed.device)
        graphed.init_cuda_graphs()
        tokens(graphed, seed=0)
        after = free_device_bytes(graphed.device)
        assert before is not None and after is not None
        kv = sum(pages.numel() * pages.element_size() for pages in graphed.token_to_kv_pool.kv_pages)
        weights = sum(param.numel() * param.element_size() for param in graphed.model.parameters())
        graphs_and_kv = before[0] - after[0] + kv
        for level in (0, 1, 2):
            levels = graphed.sleep(level)
            given = graphs_and_kv + (weights if level else 0)
            assert levels.freed_by_sleep is not None
            assert levels.freed_by_sleep >= FREED_SHARE * given, (level, levels.freed_by_sleep, given)
            graphed.wake()


def test_lazily_captured_buckets_stay_captured_across_a_sleep() -> None:
    with engine(Backend.FULL, sleep_mode=True, policy=CapturePolicy.LAZY) as graphed:
        graphed.init_cuda_graphs()
        tokens(graphed, seed=0)
        runner = graphed.decode_cuda_graph_runner
        assert runner is not None
        captured = graph_ids(graphed)
        lazy_captures = runner.metrics.lazy_captures
        assert captured, "the first generation captured its buckets on first use"
        graphed.sleep(1)
        graphed.wake()
        tokens(graphed, seed=0)  # the same batch sizes: every bucket it needs is captured already
        assert graph_ids(graphed) == captured and runner.metrics.lazy_captures == lazy_captures
