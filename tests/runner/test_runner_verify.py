"""Verify steps of speculative decoding (several tokens per request, logits of each) on the real engine on the CPU:
eager attention against step-by-step decoding, graphs (full and breakable doubles) against eager, routing, and the
generate loop's speculative and mixed steps against plain greedy decoding."""

from __future__ import annotations

import pytest
import torch
from runner_helpers import admit, graph_config, make_model_runner, prefill_eagerly, prompts_of

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.backend_utils import ShapeDescriptor
from cudagraph.config import Backend, ConfigError
from cudagraph.engine.batch import Request, SamplingParams, make_decode_batch, make_verify_batch
from cudagraph.engine.generate import Scheduler, StepPolicy, generate
from cudagraph.engine.kv_cache import CacheFullError
from cudagraph.engine.model import model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.engine.speculative import DraftModelDrafter, NgramDrafter
from cudagraph.runner import DecodeCudaGraphRunner, EagerReason, ForwardMode, PrefillCudaGraphRunner, ReplayMetadata


def verify_runner(model_runner, query_len: int, backend_kind: Backend = Backend.FULL):
    backend = CpuReplayBackend(backend_kind)
    runner = DecodeCudaGraphRunner(
        model_runner, model_runner.cuda_graph_config, backend=backend, show_progress=False, query_len=query_len
    )
    runner.capture()
    return runner, backend


def drafts_for(requests, num_tokens: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (num_tokens,), generator=generator).tolist() for _ in requests]


def test_eager_verify_logits_equal_decoding_the_same_tokens_one_by_one() -> None:
    """Token i of a verify step sees its request's cache and the drafts before it, nothing after: the causal tail."""
    model_runner = make_model_runner()
    requests = admit(model_runner, prompts_of([5, 9, 3], seed=2))
    prefill_eagerly(model_runner, requests)
    drafts = drafts_for(requests, 3, seed=4)
    verified = model_runner.forward(make_verify_batch(requests, drafts, model_runner.device)).view(3, 4, -1).clone()
    for step in range(4):
        stepwise = model_runner.forward(make_decode_batch(requests, model_runner.device))
        torch.testing.assert_close(verified[:, step], stepwise, rtol=1e-4, atol=1e-4)
        for request, draft in zip(requests, drafts, strict=True):
            request.cached_len = len(request.token_ids)
            request.output_ids.append(draft[step] if step < 3 else 0)


@pytest.mark.parametrize("backend_kind", [Backend.FULL, Backend.BREAKABLE])
@pytest.mark.parametrize("num_drafts", [1, 3])
# a batch padded to its bucket in `nox -s tests`; the smallest and the largest bucket, filled, are `slow`
@pytest.mark.parametrize(
    "batch_size", [pytest.param(1, marks=pytest.mark.slow), 3, pytest.param(8, marks=pytest.mark.slow)]
)
def test_a_verify_replay_matches_eager_at_its_padded_bucket(batch_size: int, num_drafts: int, backend_kind) -> None:
    model_runner = make_model_runner()
    runner, backend = verify_runner(model_runner, num_drafts + 1, backend_kind)
    requests = admit(model_runner, prompts_of([3 + (i % 5) for i in range(batch_size)], seed=batch_size))
    prefill_eagerly(model_runner, requests)
    batch = make_verify_batch(requests, drafts_for(requests, num_drafts), model_runner.device)
    eager = model_runner.forward(batch).clone()
    replayed = runner.replay(batch)
    assert backend.replayed == [runner.pad_to_bucket(batch_size)]
    bucket = runner.pad_to_bucket(batch_size)
    row = next(row for row in runner.metrics.bucket_rows() if row.bucket == bucket)
    # The metrics count tokens, not requests: query_len of them per request, the padded requests' included.
    assert (row.real_tokens, row.padded_tokens) == (
        batch_size * (num_drafts + 1),
        (bucket - batch_size) * (num_drafts + 1),
    )
    assert replayed.shape == eager.shape == (batch_size * (num_drafts + 1), model_runner.model.config.vocab_size)
    torch.testing.assert_close(replayed, eager, rtol=1e-5, atol=1e-5)
    assert runner.shape_descriptor(8) == ShapeDescriptor(
        tokens=8 * (num_drafts + 1), requests=8, uniform_query_len=num_drafts + 1
    )


def test_a_verify_runner_sends_other_steps_eagerly_saying_why() -> None:
    model_runner = make_model_runner()
    runner, _ = verify_runner(model_runner, 4)
    requests = admit(model_runner, prompts_of([4, 6], seed=1))
    prefill_eagerly(model_runner, requests)
    two_drafts = make_verify_batch(requests, drafts_for(requests, 2), model_runner.device)
    assert runner.route(two_drafts).reason is EagerReason.QUERY_LEN_NOT_CAPTURED
    assert runner.route(make_decode_batch(requests, model_runner.device)).reason is EagerReason.MODE_NOT_GRAPHABLE
    eager = model_runner.forward(two_drafts).clone()
    torch.testing.assert_close(runner.replay(two_drafts), eager)
    assert runner.metrics.eager_count(EagerReason.QUERY_LEN_NOT_CAPTURED) == 1


@pytest.mark.parametrize("query_len", [0, -1, 1.5, True])
def test_a_query_len_that_is_not_a_count_of_tokens_is_one_error(query_len) -> None:
    with pytest.raises(ConfigError, match="query_len must be a whole number"):
        DecodeCudaGraphRunner(make_model_runner(), make_model_runner().cuda_graph_config, query_len=query_len)


PROMPTS = [*prompts_of([3, 17, 8, 1, 25, 9], seed=7), [5, 6, 7, 8] * 4]
PARAMS = [SamplingParams(max_new_tokens=n) for n in (2, 9, 4, 6, 12, 8, 10)]


def graphed_model_runner(query_len: int) -> tuple:
    """An engine with decode (full), verify (full) and prefill (breakable) graphs on the CPU doubles."""
    model_runner = make_model_runner()
    config = model_runner.cuda_graph_config
    backends = CpuReplayBackend(Backend.FULL), CpuReplayBackend(Backend.FULL), CpuReplayBackend(Backend.BREAKABLE)
    model_runner.decode_cuda_graph_runner = DecodeCudaGraphRunner(
        model_runner, config, backend=backends[0], show_progress=False
    )
    model_runner.verify_cuda_graph_runner = DecodeCudaGraphRunner(
        model_runner,
        config,
        backend=backends[1],
        show_progress=False,
        query_len=query_len,
        metrics=model_runner.verify_cuda_graph_metrics,
    )
    model_runner.prefill_cuda_graph_runner = PrefillCudaGraphRunner(
        model_runner, config, backend=backends[2], show_progress=False
    )
    for runner in (model_runner.decode_cuda_graph_runner, model_runner.verify_cuda_graph_runner):
        runner.capture()
    model_runner.prefill_cuda_graph_runner.capture()
    return model_runner, backends


@pytest.fixture(scope="module")
def greedy_tokens() -> list[list[int]]:
    return [out.output_token_ids for out in generate(make_model_runner(), PROMPTS, PARAMS)]


@pytest.mark.parametrize("num_drafts", [1, 3])
@pytest.mark.parametrize("graphed", [False, True], ids=["eager", "graphs"])
def test_speculative_decoding_gives_exactly_the_greedy_tokens(greedy_tokens, num_drafts: int, graphed: bool) -> None:
    if graphed:
        model_runner, (decode_backend, verify_backend, _) = graphed_model_runner(num_drafts + 1)
    else:
        model_runner = make_model_runner()
    scheduler = Scheduler(model_runner, policy=StepPolicy(drafter=NgramDrafter(num_drafts)))
    got = run_to_end(scheduler)
    assert got == greedy_tokens
    stats = scheduler.stats
    assert stats.verify_steps > 0 and stats.decode_steps == 0
    assert stats.drafted_tokens >= stats.verify_steps * num_drafts
    # The repeating prompt's continuation is drafted right at least once: speculation saved steps.
    assert stats.accepted_tokens > 0
    if graphed:
        assert len(set(verify_backend.replayed)) > 1  # verify steps replayed graphs at several batch sizes
        assert not decode_backend.replayed  # every decode step was a verify step
        metrics = model_runner.verify_cuda_graph_metrics
        assert metrics.replays == stats.verify_steps


def run_to_end(scheduler: Scheduler) -> list[list[int]]:
    return [output.output_token_ids for output in scheduler.run(PROMPTS, PARAMS)]


@pytest.mark.parametrize("graphed", [False, True], ids=["eager", "graphs"])
def test_mixed_steps_with_chunked_prefill_give_exactly_the_greedy_tokens(greedy_tokens, graphed: bool) -> None:
    if graphed:
        model_runner, (decode_backend, _, prefill_backend) = graphed_model_runner(2)
    else:
        model_runner = make_model_runner()
    # A budget of 16 tokens: the 17- and 25-token prompts go in chunks, beside running requests' decode tokens.
    scheduler = Scheduler(model_runner, max_prefill_tokens=16, policy=StepPolicy(mixed=True))
    assert run_to_end(scheduler) == greedy_tokens
    assert scheduler.stats.mixed_steps > 0 and scheduler.stats.decode_steps > 0
    if graphed:
        assert prefill_backend.replayed  # the non-uniform steps replayed the prefill runner's graphs
        assert decode_backend.replayed  # steps of decodes alone are uniform: the decode graphs


def test_speculation_refuses_sampling_and_mixing() -> None:
    with pytest.raises(ValueError, match="exclusive"):
        StepPolicy(mixed=True, drafter=NgramDrafter(2))
    scheduler = Scheduler(make_model_runner(), policy=StepPolicy(drafter=NgramDrafter(2)))
    with pytest.raises(ValueError, match="greedy only"):
        scheduler.add(Request(0, [1, 2], SamplingParams(temperature=0.7)))


def test_an_attention_backend_without_verify_steps_is_one_error_before_capture() -> None:
    model_runner = make_model_runner()
    model_runner.attn_backend.supports_verify = False
    model_runner.attention_backend_name = "flashinfer"
    with pytest.raises(ConfigError, match="'flashinfer' attention backend cannot yet"):
        model_runner.init_verify_cuda_graph(4)
    assert model_runner.verify_cuda_graph_runner is None


def test_the_forward_mode_says_which_steps_are_uniform() -> None:
    assert [mode.is_uniform() for mode in ForwardMode] == [True, False, False, True]


def test_holding_a_request_the_cache_has_no_room_for_takes_nothing() -> None:
    model_runner = make_model_runner(max_num_reqs=4)
    rows, slots = model_runner.req_to_token_pool.available, model_runner.token_to_kv_pool.available
    too_long = Request(0, [1] * 10, SamplingParams(max_new_tokens=slots))
    with pytest.raises(CacheFullError):
        model_runner.hold(too_long)
    assert (model_runner.req_to_token_pool.available, model_runner.token_to_kv_pool.available) == (rows, slots)
    held = model_runner.hold(Request(1, [1, 2, 3], SamplingParams(max_new_tokens=2)))
    assert model_runner.token_to_kv_pool.available == slots - held.budget
    model_runner.release(held)
    assert (model_runner.req_to_token_pool.available, model_runner.token_to_kv_pool.available) == (rows, slots)


def draft_engine(seed: int, with_graphs: bool) -> tuple:
    """A draft engine of the target's shape (``seed`` 0: the target's own weights), with decode (full) and prefill
    (breakable) graphs on the CPU doubles when asked."""
    model = random_model(model_config_from_preset("tiny-qwen3-random"), seed=seed, dtype="float32", device="cpu")
    draft = ModelRunner(model, graph_config(), cache_config=CacheConfig(16, max_context_len=64))
    backends = CpuReplayBackend(Backend.FULL), CpuReplayBackend(Backend.BREAKABLE)
    if with_graphs:
        config = draft.cuda_graph_config
        draft.decode_cuda_graph_runner = DecodeCudaGraphRunner(draft, config, backend=backends[0], show_progress=False)
        draft.prefill_cuda_graph_runner = PrefillCudaGraphRunner(
            draft, config, backend=backends[1], show_progress=False
        )
        draft.decode_cuda_graph_runner.capture()
        draft.prefill_cuda_graph_runner.capture()
    return draft, backends


# the same draft graphed is `slow`: the other draft's run replays the same graphs and rejects tokens too
@pytest.mark.parametrize(
    ("seed", "graphed"),
    [(0, False), pytest.param(0, True, marks=pytest.mark.slow), (5, True)],
    ids=["same-eager", "same", "other"],
)
def test_a_draft_model_gives_exactly_the_greedy_tokens(greedy_tokens, seed: int, graphed: bool) -> None:
    """With the target's own weights every draft is right (all accepted); with other weights few are, and the tokens
    are the greedy ones either way. The draft engine's steps replay its own graphs."""
    model_runner = graphed_model_runner(4)[0] if graphed else make_model_runner()
    draft, (draft_decode, draft_prefill) = draft_engine(seed, graphed)
    drafter = DraftModelDrafter(draft, num_tokens=3)
    free_slots = draft.token_to_kv_pool.available
    scheduler = Scheduler(model_runner, policy=StepPolicy(drafter=drafter))
    assert run_to_end(scheduler) == greedy_tokens
    stats = scheduler.stats
    if seed == 0:
        # Every draft agrees until a request has fewer than k + 1 tokens left to make.
        assert stats.accepted_tokens >= stats.drafted_tokens - 3 * len(PROMPTS)
    if graphed:
        assert draft_decode.replayed and draft_prefill.replayed
    assert not drafter.mirrors  # every finished request gave its draft rows and slots back
    assert draft.token_to_kv_pool.available == free_slots


def test_a_draft_model_of_another_vocabulary_is_one_error() -> None:
    config = model_config_from_preset("tiny-qwen3-random").with_overrides(vocab_size=300)
    model = random_model(config, seed=0, dtype="float32", device="cpu")
    draft = ModelRunner(model, graph_config(), cache_config=CacheConfig(4, max_context_len=32))
    with pytest.raises(ValueError, match="a draft model must share the target's tokenizer"):
        Scheduler(make_model_runner(), policy=StepPolicy(drafter=DraftModelDrafter(draft, num_tokens=2)))


def test_two_verify_runners_of_different_lengths_share_an_engine() -> None:
    """Each length keeps its own static metadata in the attention backend: replays of both, interleaved, equal eager
    (the graphs of one length never read the other's)."""
    model_runner = make_model_runner()
    runners = {drafts: verify_runner(model_runner, drafts + 1)[0] for drafts in (1, 3)}
    requests = admit(model_runner, prompts_of([4, 9, 6], seed=3))
    prefill_eagerly(model_runner, requests)
    for drafts in (1, 3, 1, 3):
        batch = make_verify_batch(requests, drafts_for(requests, drafts, seed=drafts), model_runner.device)
        eager = model_runner.forward(batch).clone()
        torch.testing.assert_close(runners[drafts].replay(batch), eager, rtol=1e-5, atol=1e-5)


def test_the_replay_metadata_of_a_verify_batch_says_its_query_len() -> None:
    model_runner = make_model_runner()
    requests = admit(model_runner, prompts_of([4, 6], seed=2))
    prefill_eagerly(model_runner, requests)
    verify = make_verify_batch(requests, drafts_for(requests, 3), model_runner.device)
    assert ReplayMetadata.of_batch(verify).query_len == 4
    assert ReplayMetadata.of_batch(make_decode_batch(requests, model_runner.device)).query_len == 1
