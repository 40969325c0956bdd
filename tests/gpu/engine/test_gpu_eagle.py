"""EAGLE drafting on a real GPU: the draft chain (``k - 1`` steps in one graph) and the draft extend replay their graphs
on the decode phase's backend (``full``, ``breakable``, ``tc_piecewise``) at every captured bucket, and the tokens equal
plain greedy decoding's (lossless) and the drafts equal the eager drafting path's.

- A random head over a two-layer float32 target: drafts mostly rejected, one token a verify step, so the running
  batch (24 requests finishing one by one) walks down through every bucket.
- The self-draft head over a one-layer target: (nearly) every draft accepted, close to ``k + 1`` tokens a request
  and verify step.

Every engine is shut down even when a test fails, so no graph pool is left behind for the next test.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
import torch._dynamo

from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
from cudagraph.engine.batch import SamplingParams
from cudagraph.engine.eagle import EagleModelRunner
from cudagraph.engine.generate import GenerationStats, Scheduler, StepPolicy
from cudagraph.engine.model import model_config_from_preset, random_model
from cudagraph.engine.model.eagle import eagle_head_from_source
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.engine.speculative import EagleDrafter

DECODE_BUCKETS = (1, 2, 4, 8, 16, 24)
PREFILL_BUCKETS = (16, 32, 64, 128, 256)
NUM_TOKENS = 3
PRESET = "tiny-qwen3-random"


def graphs(decode: Backend) -> CudaGraphConfig:
    prefill = Backend.DISABLED if decode is Backend.DISABLED else Backend.BREAKABLE
    return CudaGraphConfig(
        decode=PhaseConfig(decode, () if decode is Backend.DISABLED else DECODE_BUCKETS, max(DECODE_BUCKETS)),
        prefill=PhaseConfig(prefill, () if prefill is Backend.DISABLED else PREFILL_BUCKETS, max(PREFILL_BUCKETS)),
    )


@contextlib.contextmanager
def engine(decode: Backend, num_layers: int, keep_hidden_states: int = 0) -> Iterator[ModelRunner]:
    """A CUDA float32 target with random weights, its graphs (and verify graphs) captured; shut down on exit."""
    config = model_config_from_preset(PRESET).with_overrides(num_layers=num_layers)
    model = random_model(config, seed=3, dtype="float32", device="cuda")
    cache = CacheConfig(max_num_reqs=32, max_context_len=256)
    runner = ModelRunner(model, graphs(decode), cache_config=cache, keep_hidden_states=keep_hidden_states)
    try:
        runner.init_cuda_graphs()
        if decode is not Backend.DISABLED:
            runner.init_verify_cuda_graph(NUM_TOKENS + 1)
        yield runner
    finally:
        runner.shutdown()


def workload(count: int = 24) -> tuple[list[list[int]], list[SamplingParams]]:
    """``count`` prompts of 4 to 19 tokens; prompt ``i`` wants ``2 + 3 i`` tokens, so requests finish one by one."""
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 512, (4 + index % 16,), generator=generator).tolist() for index in range(count)]
    return prompts, [SamplingParams(max_new_tokens=2 + 3 * index) for index in range(count)]


@pytest.fixture(scope="module")
def greedy() -> dict[int, list[list[int]]]:
    """Plain greedy decoding's tokens (no graphs), by the target's layer count."""
    tokens = {}
    for layers in (1, 2):
        with engine(Backend.DISABLED, layers) as eager:
            tokens[layers] = [out.output_token_ids for out in Scheduler(eager).run(*workload())]
    return tokens


@dataclass
class EagleRun:
    tokens: list[list[int]]
    drafts: list[list[list[int]]]
    stats: GenerationStats
    buckets: set[int]
    """Buckets the draft chain replayed (empty when the drafts ran eagerly)."""


def eagle_run(target: ModelRunner, head: str, graphed_drafts: bool) -> EagleRun:
    """Speculative decoding of ``workload`` on ``target`` with an EAGLE head of its own (``random``, seeded, or
    ``self``), recording every proposal; the head's graphs checked and freed after."""
    eagle = EagleModelRunner(target, eagle_head_from_source(head, target.model, seed=1), NUM_TOKENS)
    try:
        if graphed_drafts:
            eagle.init_cuda_graphs()
        drafter = EagleDrafter(eagle)
        proposals: list[list[list[int]]] = []
        propose = drafter.propose_batch

        def recording(requests):  # type: ignore[no-untyped-def]
            proposals.append(propose(requests))
            return proposals[-1]

        drafter.propose_batch = recording  # type: ignore[method-assign]
        scheduler = Scheduler(target, policy=StepPolicy(drafter=drafter))
        tokens = [out.output_token_ids for out in scheduler.run(*workload())]
        chain, extend = eagle.draft_cuda_graph_runner, eagle.draft_extend_cuda_graph_runner
        buckets: set[int] = set()
        if graphed_drafts:
            assert chain is not None and extend is not None
            assert chain.stats.graphs == extend.stats.graphs == len(DECODE_BUCKETS)
            assert chain.metrics.eager == 0 and extend.metrics.eager == 0, "every draft step replayed a graph"
            assert chain.metrics.replays == scheduler.stats.verify_steps
            sizes = [size for size, count in enumerate(chain.metrics.replays_by_size) if count and size]
            buckets = {chain.pad_to_bucket(size) for size in sizes}
        return EagleRun(tokens, proposals, scheduler.stats, buckets)
    finally:
        eagle.shutdown()


@pytest.mark.gpu
@pytest.mark.parametrize("decode", [Backend.FULL, Backend.BREAKABLE, Backend.TC_PIECEWISE])
def test_graphed_eagle_drafting_is_lossless_and_equals_eager_drafting_at_every_bucket(greedy, decode: Backend) -> None:
    """One target (its graphs on ``decode``) serves both runs, so both drafters read the same hidden states."""
    torch._dynamo.reset()
    with engine(decode, 2, keep_hidden_states=NUM_TOKENS + 1) as target:
        eager = eagle_run(target, "random", graphed_drafts=False)
        graphed = eagle_run(target, "random", graphed_drafts=True)
    for index, (want, have) in enumerate(zip(greedy[2], graphed.tokens, strict=True)):
        assert have == want, f"prompt {index} diverged from greedy decoding"
    assert eager.tokens == greedy[2]
    assert graphed.drafts == eager.drafts, "graphed drafts differ from the eager drafting path's"
    assert graphed.buckets == set(DECODE_BUCKETS), (
        f"the draft chain replayed {sorted(graphed.buckets)}, not every bucket"
    )
    assert graphed.stats.decode_steps == 0 and graphed.stats.verify_steps > 0


@pytest.mark.gpu
@pytest.mark.parametrize("decode", [Backend.FULL, Backend.BREAKABLE, Backend.TC_PIECEWISE])
def test_the_self_draft_head_gives_the_greedy_tokens_near_k_plus_one_a_step(greedy, decode: Backend) -> None:
    torch._dynamo.reset()
    with engine(decode, 1, keep_hidden_states=NUM_TOKENS + 1) as target:
        run = eagle_run(target, "self", graphed_drafts=True)
    assert run.tokens == greedy[1]
    stats = run.stats
    assert stats.accepted_tokens >= 0.95 * stats.drafted_tokens, (stats.accepted_tokens, stats.drafted_tokens)
    request_steps = stats.drafted_tokens // NUM_TOKENS  # one per request per verify step
    per_step = (request_steps + stats.accepted_tokens) / request_steps
    print(f"{decode}: {per_step:.2f} tokens a request a verify step (k + 1 = {NUM_TOKENS + 1})")
    assert per_step > NUM_TOKENS
