"""Speculative decoding and mixed batches on a real GPU: the tokens plain greedy decoding gives, from real graphs.

- Verify steps (the last token and ``k`` drafts a request, logits of every token) replay ``full`` graphs of the
  verify runner at every captured batch size (48 requests shrinking to 1), for ``k`` in {1, 3}; the tokens equal
  eager greedy decoding's.
- Mixed steps (chunked prefill beside running decodes, one extend step) replay the prefill runner's ``breakable``
  graphs, steps of decodes alone the decode runner's ``full`` graphs; the tokens equal eager greedy decoding's.

Random-weight float32 models keep greedy ties out of the comparison. Every engine is shut down even when a test
fails, so a failure never leaves a graph pool behind for the next test.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pytest
import torch
import torch._dynamo
from test_gpu_engine_graphs import FLASHINFER_MODEL

from cudagraph.config import Backend, ConfigError, CudaGraphConfig, Phase, PhaseConfig
from cudagraph.engine.batch import Request, SamplingParams
from cudagraph.engine.generate import Scheduler, StepPolicy
from cudagraph.engine.model import ModelConfig, model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.engine.speculative import DraftModelDrafter, NgramDrafter
from cudagraph.runner import EagerReason

DECODE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48)
PREFILL_BUCKETS = (16, 32, 64, 128)


def graphs(decode: Backend, prefill: Backend) -> CudaGraphConfig:
    return CudaGraphConfig(
        decode=PhaseConfig(decode, () if decode is Backend.DISABLED else DECODE_BUCKETS, 48),
        prefill=PhaseConfig(prefill, () if prefill is Backend.DISABLED else PREFILL_BUCKETS, 128),
    )


@contextlib.contextmanager
def engine(
    config: CudaGraphConfig,
    verify_query_len: int | None = None,
    attention: str = "torch",
    preset: str | ModelConfig = "tiny-qwen3-random",
    dtype: str = "float32",
) -> Iterator[ModelRunner]:
    """A CUDA engine with random weights and its graphs captured; shut down on exit."""
    model_config = model_config_from_preset(preset) if isinstance(preset, str) else preset
    model = random_model(model_config, seed=3, dtype=dtype, device="cuda")
    cache = CacheConfig(max_num_reqs=64, max_context_len=256)
    runner = ModelRunner(model, config, cache_config=cache, attention_backend=attention)
    try:
        runner.init_cuda_graphs()
        if verify_query_len is not None:
            runner.init_verify_cuda_graph(verify_query_len)
        yield runner
    finally:
        runner.shutdown()


def workload(count: int = 48, seed: int = 0) -> tuple[list[list[int]], list[SamplingParams]]:
    """``count`` prompts, half of them repeating a short phrase (so n-gram drafts are accepted); prompt ``i`` wants
    ``i + 1`` tokens, so the running batch walks down through every size."""
    generator = torch.Generator().manual_seed(seed)
    prompts = []
    for index in range(count):
        phrase = torch.randint(0, 512, (int(torch.randint(2, 6, (1,), generator=generator)),), generator=generator)
        prompts.append(phrase.tolist() * 4 if index % 2 else torch.randint(0, 512, (12,), generator=generator).tolist())
    return prompts, [SamplingParams(max_new_tokens=index + 2) for index in range(count)]


def run(model_runner: ModelRunner, policy: StepPolicy | None = None, max_prefill_tokens: int | None = None):
    scheduler = Scheduler(model_runner, max_prefill_tokens, policy)
    outputs = scheduler.run(*workload())
    return [output.output_token_ids for output in outputs], scheduler.stats


@pytest.fixture(scope="module")
def greedy_tokens() -> list[list[int]]:
    with engine(graphs(Backend.DISABLED, Backend.DISABLED)) as eager:
        tokens, _ = run(eager)
    return tokens


@dataclass
class ScriptedDrafter:
    """Drafts from the known greedy continuation of each prompt, with its last draft wrong on every other step of a
    request: a step then accepts ``k`` or ``k - 1`` drafts, exactly as planned, so the order in which requests finish
    (and so every batch size the run goes through) is known before it runs; the wrong drafts exercise rejection."""

    greedy_tokens: list[list[int]]
    num_tokens: int
    steps: dict[int, int] = field(default_factory=dict)

    def propose_batch(self, requests: Sequence[Request]) -> list[list[int]]:
        return [self.propose(request) for request in requests]

    def propose(self, request: Request) -> list[int]:
        produced = len(request.output_ids)
        drafts = self.greedy_tokens[request.index][produced : produced + self.num_tokens]
        drafts += [0] * (self.num_tokens - len(drafts))  # past the request's end: cut by max_new_tokens anyway
        step = self.steps.get(request.index, 0)
        self.steps[request.index] = step + 1
        if step % 2:
            drafts[-1] = 1 if drafts[-1] == 0 else 0
        return drafts

    def release(self, request: Request) -> None:
        self.steps.pop(request.index, None)


def staggered_workload(count: int = 48) -> tuple[list[list[int]], list[SamplingParams]]:
    """``workload``'s prompts, prompt ``i`` wanting ``2 + 4 i`` tokens: a verify step gives at most ``k + 1 <= 4``
    tokens a request, so no two requests finish in one step and the running batch walks down through every size."""
    prompts, _ = workload(count)
    return prompts, [SamplingParams(max_new_tokens=2 + 4 * index) for index in range(count)]


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["torch", "triton"])
@pytest.mark.parametrize("num_drafts", [1, 3])
def test_verify_graphs_give_the_greedy_tokens_at_every_batch_size(num_drafts: int, attention: str) -> None:
    with engine(graphs(Backend.DISABLED, Backend.DISABLED), attention=attention) as eager:
        greedy_tokens = [out.output_token_ids for out in Scheduler(eager).run(*staggered_workload())]
    config = graphs(Backend.FULL, Backend.BREAKABLE)
    with engine(config, verify_query_len=num_drafts + 1, attention=attention) as graphed:
        scheduler = Scheduler(graphed, policy=StepPolicy(drafter=ScriptedDrafter(greedy_tokens, num_drafts)))
        tokens = [out.output_token_ids for out in scheduler.run(*staggered_workload())]
        verify = graphed.verify_cuda_graph_runner
        assert verify is not None and verify.stats.graphs == len(DECODE_BUCKETS)
        replayed = [size for size, count in enumerate(verify.metrics.replays_by_size) if count and size]
        eager_steps = graphed.verify_cuda_graph_metrics.eager
    for index, (want, have) in enumerate(zip(greedy_tokens, tokens, strict=True)):
        assert have == want, f"prompt {index} diverged"
    assert replayed == list(range(1, 49)), f"verify steps ran batch sizes {replayed}, not every size from 48 to 1"
    buckets = sorted({verify.pad_to_bucket(size) for size in replayed})
    assert buckets == list(DECODE_BUCKETS), f"verify steps replayed buckets {buckets}, not every captured one"
    stats = scheduler.stats
    assert eager_steps == 0 and stats.decode_steps == 0
    assert 0 < stats.accepted_tokens < stats.drafted_tokens, "the scripted drafts are partly accepted"
    print(
        f"k={num_drafts}: {stats.verify_steps} verify steps, {stats.accepted_tokens}/{stats.drafted_tokens} drafts "
        "accepted"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["torch", "triton"])
def test_ngram_drafts_replay_verify_graphs_and_give_the_greedy_tokens(attention: str) -> None:
    with engine(graphs(Backend.DISABLED, Backend.DISABLED), attention=attention) as eager:
        greedy_tokens, _ = run(eager)  # plain greedy decoding on the same attention kernels
    with engine(graphs(Backend.FULL, Backend.BREAKABLE), verify_query_len=4, attention=attention) as graphed:
        tokens, stats = run(graphed, StepPolicy(drafter=NgramDrafter(3)))
        eager_steps = graphed.verify_cuda_graph_metrics.eager
    assert tokens == greedy_tokens
    assert eager_steps == 0 and stats.accepted_tokens > 0, "the repeating prompts' drafts should be accepted"


@pytest.mark.gpu
def test_tc_piecewise_verify_graphs_give_the_greedy_tokens(greedy_tokens) -> None:
    """Decode ``tc_piecewise`` (the eager compiler): the verify runner compiles the forward for its k + 1 token rows a
    request and replays its recorded sequences; no verify step runs eagerly."""
    torch._dynamo.reset()
    with engine(graphs(Backend.TC_PIECEWISE, Backend.BREAKABLE), verify_query_len=4) as graphed:
        tokens, stats = run(graphed, StepPolicy(drafter=NgramDrafter(3)))
        verify = graphed.verify_cuda_graph_runner
        assert verify is not None and verify.stats.graphs == len(DECODE_BUCKETS)
        # The backend was given each bucket's descriptor (prepare's entries), not left to guess it from its phase.
        given = {bucket: verify.backend.descriptor(bucket) for bucket in verify.captured_buckets}
        assert given == {bucket: verify.shape_descriptor(bucket) for bucket in verify.captured_buckets}
        assert {descriptor.uniform_query_len for descriptor in given.values()} == {4}
        eager_steps = graphed.verify_cuda_graph_metrics.eager
    assert tokens == greedy_tokens
    assert eager_steps == 0 and stats.verify_steps > 0


@pytest.mark.gpu
def test_eager_verify_steps_give_the_greedy_tokens(greedy_tokens) -> None:
    with engine(graphs(Backend.DISABLED, Backend.DISABLED)) as eager:
        tokens, stats = run(eager, StepPolicy(drafter=NgramDrafter(3)))
        counted = eager.verify_cuda_graph_metrics.eager_count(EagerReason.PHASE_DISABLED)
    assert tokens == greedy_tokens
    assert counted == stats.verify_steps


@pytest.mark.gpu
def test_mixed_steps_replay_prefill_graphs_and_decode_steps_full_graphs(greedy_tokens) -> None:
    with engine(graphs(Backend.FULL, Backend.BREAKABLE)) as graphed:
        tokens, stats = run(graphed, StepPolicy(mixed=True), max_prefill_tokens=64)
        decode = graphed.cuda_graph_metrics[Phase.DECODE]
        prefill_runner = graphed.prefill_cuda_graph_runner
        assert prefill_runner is not None
        prefill = prefill_runner.metrics
    assert tokens == greedy_tokens
    assert stats.mixed_steps > 0 and stats.decode_steps > 0
    assert prefill.replays == stats.mixed_steps + stats.prefill_steps and prefill.eager == 0
    assert decode.replays == stats.decode_steps and decode.eager == 0


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="flashinfer is not installed")
def test_flashinfer_attention_refuses_verify_steps_in_one_error() -> None:
    flashinfer_engine = engine(
        graphs(Backend.FULL, Backend.BREAKABLE), attention="flashinfer", preset=FLASHINFER_MODEL, dtype="bfloat16"
    )
    with flashinfer_engine as flash:
        with pytest.raises(ConfigError, match="'flashinfer' attention backend cannot yet"):
            flash.init_verify_cuda_graph(4)
        assert flash.verify_cuda_graph_runner is None


@pytest.mark.gpu
def test_a_draft_model_drafts_from_its_own_graphs_and_gives_the_greedy_tokens(greedy_tokens) -> None:
    """The draft engine has the target's weights, so its drafts are right until a request runs out of tokens to make:
    its catch-up extend steps replay its prefill graphs, its draft steps its decode graphs."""
    config = graphs(Backend.FULL, Backend.BREAKABLE)
    with engine(config, verify_query_len=4) as target, engine(config) as draft:
        drafter = DraftModelDrafter(draft, num_tokens=3)
        tokens, stats = run(target, StepPolicy(drafter=drafter))
        draft_decode = draft.cuda_graph_metrics[Phase.DECODE]
        draft_prefill = draft.cuda_graph_metrics[Phase.PREFILL]
    assert tokens == greedy_tokens
    assert stats.accepted_tokens >= stats.drafted_tokens - 3 * len(tokens)
    assert draft_decode.replays > 0 and draft_decode.eager == 0
    assert draft_prefill.replays > 0
