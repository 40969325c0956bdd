"""LoRA adapters under real CUDA graphs: for each decode backend (full, breakable, tc_piecewise), a workload whose
requests mix two adapters and no adapter, decoding through every batch size from 16 down to 1, gives the greedy
tokens of an eager engine with the same adapters; steps with an adapter replay the LoRA variant at every bucket,
steps without one the plain graphs; an adapter loaded into a slot in place replays the same graphs (nothing
captured again) and gives its own tokens. Float32 random weights keep ties out, so tokens must match exactly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from lora_factors import random_lora_adapter

from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
from cudagraph.engine.batch import SamplingParams
from cudagraph.engine.generate import generate
from cudagraph.engine.lora import LoraAdapter, LoraConfig
from cudagraph.engine.model import model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner

pytestmark = pytest.mark.gpu

PRESET = "tiny-qwen3-random"
DECODE_BUCKETS = (1, 2, 4, 8, 16)
LORA = LoraConfig(max_loras=3, max_rank=8)
NAMES = ("a", "b", None)
"""Request ``i`` runs through ``NAMES[i % 3]``."""


def config(backend: Backend) -> CudaGraphConfig:
    enabled = backend is not Backend.DISABLED
    return CudaGraphConfig(
        decode=PhaseConfig(backend, DECODE_BUCKETS if enabled else (), 16 if enabled else 0),
        prefill=PhaseConfig(Backend.DISABLED, (), 0),
    )


def random_adapter(rank: int, seed: int) -> LoraAdapter:
    """Random factors of ``rank`` on q/k/v/o of every layer, large enough to change greedy tokens."""
    generator = torch.Generator().manual_seed(seed)
    return random_lora_adapter(model_config_from_preset(PRESET), rank, generator, device="cuda")


ADAPTERS = {"a": (8, 11), "b": (4, 12)}
"""Name -> (rank, seed)."""


@contextlib.contextmanager
def engine(backend: Backend, kernel_backend: str = "auto") -> Iterator[ModelRunner]:
    """A CUDA engine serving adapters ``a`` and ``b`` on ``kernel_backend``'s kernel set, its graphs (both variants)
    captured; shut down on exit."""
    model = random_model(model_config_from_preset(PRESET), seed=3, dtype="float32", device="cuda")
    cache = CacheConfig(max_num_reqs=24, max_context_len=64)
    model_runner = ModelRunner(
        model, config(backend), cache_config=cache, lora_config=LORA, kernel_backend=kernel_backend
    )
    try:
        for name, (rank, seed) in ADAPTERS.items():
            model_runner.load_lora_adapter(name, random_adapter(rank, seed))
        model_runner.init_cuda_graphs()
        yield model_runner
    finally:
        model_runner.shutdown()


def workload(names: tuple[str | None, ...], count: int = 17) -> tuple[list[list[int]], list[SamplingParams]]:
    """``count`` prompts, prompt ``i`` wanting ``i + 1`` tokens through ``names[i % len(names)]``: decode walks down
    through every batch size from ``count - 1`` to 1."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, 20, (count,), generator=generator).tolist()
    prompts = [torch.randint(0, 512, (n,), generator=generator).tolist() for n in lengths]
    return prompts, [SamplingParams(max_new_tokens=i + 1, lora_name=names[i % len(names)]) for i in range(count)]


def tokens(model_runner: ModelRunner, names: tuple[str | None, ...] = NAMES) -> list[list[int]]:
    prompts, params = workload(names)
    return [output.output_token_ids for output in generate(model_runner, prompts, params)]


def replayed_buckets(runner) -> list[int]:
    return [row.bucket for row in runner.metrics.bucket_rows() if row.replays]


@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE, Backend.TC_PIECEWISE])
def test_both_variants_give_eager_tokens_at_every_decode_bucket(backend: Backend) -> None:
    with engine(Backend.DISABLED) as eager:
        want_mixed, want_plain = tokens(eager), tokens(eager, (None,))
    with engine(backend) as graphed:
        lora_runner, plain_runner = graphed.lora_decode_cuda_graph_runner, graphed.decode_cuda_graph_runner
        assert lora_runner is not None and plain_runner is not None
        assert lora_runner.captured_buckets == plain_runner.captured_buckets == DECODE_BUCKETS
        got_mixed = tokens(graphed)
        assert replayed_buckets(lora_runner) == list(DECODE_BUCKETS)
        assert plain_runner.metrics.replays == 0  # every step of the mix had an adapter until the last request
        got_plain = tokens(graphed, (None,))
        assert replayed_buckets(plain_runner) == list(DECODE_BUCKETS)
        assert lora_runner.metrics.eager == 0 and plain_runner.metrics.eager == 0
    assert got_mixed == want_mixed and got_plain == want_plain
    assert want_mixed != want_plain  # the adapters change the tokens of the requests that use them


@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE, Backend.TC_PIECEWISE])
def test_an_adapter_loaded_in_place_replays_without_recapture(backend: Backend) -> None:
    replacement = random_adapter(6, 99)
    with engine(Backend.DISABLED) as eager:
        eager.load_lora_adapter("a", replacement)
        want = tokens(eager)
    with engine(backend) as graphed:
        runner = graphed.lora_decode_cuda_graph_runner
        assert runner is not None
        before = tokens(graphed)
        captured, replays, graphs = runner.captured_buckets, runner.metrics.replays, runner.stats.graphs
        graphed.load_lora_adapter("a", replacement)
        got = tokens(graphed)
        assert runner.refresh_graphs(on_moved="raise") == ()
        assert runner.captured_buckets == captured and runner.stats.graphs == graphs
        assert runner.metrics.replays > replays
    assert got == want and got != before
