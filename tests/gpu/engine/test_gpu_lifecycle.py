"""Graphs across an engine's life on a real GPU: the same life for each decode backend (full, breakable,
tc_piecewise) and each capture policy (eager, lazy), against an eager engine of the same weights living the same
life.

The life: generate; update weights in place (no graph captured again); sleep (graphs, pool and KV cache given back:
at least 95 % of their bytes, read by ``torch.cuda.mem_get_info``); wake (the next steps replay); update weights with
new memory (the graphs that read them captured again); generate after each. Every generation's greedy tokens must
equal the eager engine's exactly (float32 random weights keep ties out).

How "graph and KV bytes" is read: free device memory after the engine is built and before its graphs exist, minus
free memory after the first generation (the graphs, their pool and the static buffers), plus the KV cache's bytes.
A throwaway engine captures and shuts down first, so what a process loads once for good (the capture stream's
workspaces, lazily loaded kernels) is not counted as the graphs'.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from cudagraph.config import Backend, CapturePolicy, CudaGraphConfig, PhaseConfig
from cudagraph.engine.batch import SamplingParams
from cudagraph.engine.generate import generate
from cudagraph.engine.lifecycle import free_device_bytes
from cudagraph.engine.model import model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.runner.lifecycle import RunnerState

pytestmark = pytest.mark.gpu

PRESET = "tiny-qwen3-random"
DECODE_BUCKETS = (1, 2, 4, 8, 16)
CACHE = CacheConfig(max_num_reqs=24, max_context_len=64, num_kv_slots=262144)
"""A KV cache of tens of MiB, so the bytes sleep frees are well above the driver's 2 MiB pages."""
FREED_SHARE = 0.95


def config(backend: Backend, policy: CapturePolicy) -> CudaGraphConfig:
    enabled = backend is not Backend.DISABLED
    return CudaGraphConfig(
        decode=PhaseConfig(backend, DECODE_BUCKETS if enabled else (), 16 if enabled else 0, capture_policy=policy),
        prefill=PhaseConfig(Backend.DISABLED, (), 0),
    )


@contextlib.contextmanager
def engine(backend: Backend, policy: CapturePolicy = CapturePolicy.EAGER) -> Iterator[ModelRunner]:
    model = random_model(model_config_from_preset(PRESET), seed=3, dtype="float32", device="cuda")
    runner = ModelRunner(model, config(backend, policy), cache_config=CACHE)
    try:
        yield runner
    finally:
        runner.shutdown()


def workload(seed: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """Twelve prompts wanting 1..12 tokens, so decode walks through batch sizes 11..1."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 20, (12,), generator=generator).tolist()
    prompts = [torch.randint(0, 512, (n,), generator=generator).tolist() for n in lengths]
    return prompts, [SamplingParams(max_new_tokens=i + 1) for i in range(12)]


def tokens(model_runner: ModelRunner, seed: int) -> list[list[int]]:
    prompts, params = workload(seed)
    return [output.output_token_ids for output in generate(model_runner, prompts, params)]


def new_weights(model_runner: ModelRunner, seed: int) -> dict[str, torch.Tensor]:
    """Other random values for every weight of the first decoder layer (the same for every engine given a seed)."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return {
        name: torch.randn(param.shape, generator=generator, device="cuda", dtype=param.dtype) * 0.05
        for name, param in model_runner.model.named_parameters()
        if ".0." in name and name.endswith("weight")
    }


def kv_bytes(model_runner: ModelRunner) -> int:
    return sum(pages.numel() * pages.element_size() for pages in model_runner.token_to_kv_pool.kv_pages)


@pytest.fixture(scope="module", autouse=True)
def loaded_for_good() -> None:
    """One capture and shutdown of every backend before any reading (process-lifetime loads done)."""
    for backend in (Backend.FULL, Backend.BREAKABLE, Backend.TC_PIECEWISE):
        with engine(backend) as warm:
            warm.init_decode_cuda_graph()
            tokens(warm, seed=0)


@pytest.mark.parametrize("policy", list(CapturePolicy))
@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE, Backend.TC_PIECEWISE])
def test_a_life_of_updates_sleeps_and_wakes_gives_eager_tokens(backend: Backend, policy: CapturePolicy) -> None:
    with engine(Backend.DISABLED) as eager, engine(backend, policy) as graphed:
        before_graphs = free_device_bytes(graphed.device)
        assert before_graphs is not None
        runner = graphed.init_decode_cuda_graph()
        assert runner is not None and runner.capture_policy is policy
        if policy is CapturePolicy.LAZY:
            assert runner.captured_buckets == ()
        assert tokens(graphed, 1) == tokens(eager, 1)
        assert runner.metrics.replays > 0
        captured = runner.captured_buckets
        assert captured, "the first generation should have graphs to replay"

        # In place: the same graphs replay the new weights.
        for engine_runner in (eager, graphed):
            update = engine_runner.update_weights(new_weights(engine_runner, seed=10))
        assert update.recaptured == {"decode": ()} and runner.captured_buckets == captured
        assert tokens(graphed, 2) == tokens(eager, 2)

        # Sleep gives back the graphs, their pool and the KV cache.
        after_graphs = free_device_bytes(graphed.device)
        assert after_graphs is not None
        graph_bytes = before_graphs[0] - after_graphs[0]
        levels = graphed.sleep()
        assert levels.freed_by_sleep is not None
        assert levels.freed_by_sleep >= FREED_SHARE * (kv_bytes(graphed) + graph_bytes), levels
        assert runner.state is RunnerState.ASLEEP

        # Wake: captured again (or on first use), and the next steps replay.
        graphed.wake()
        assert runner.state is RunnerState.AWAKE and levels.awake is not None
        replays = runner.metrics.replays
        assert tokens(graphed, 3) == tokens(eager, 3)
        assert runner.metrics.replays > replays

        # New memory: the graphs that read it are captured again, never replayed stale.
        held = runner.captured_buckets
        assert held
        for engine_runner in (eager, graphed):
            update = engine_runner.update_weights(new_weights(engine_runner, seed=20), in_place=False)
        assert update.recaptured["decode"] == held
        assert runner.graph_inputs.stale() == {}
        assert tokens(graphed, 4) == tokens(eager, 4)
