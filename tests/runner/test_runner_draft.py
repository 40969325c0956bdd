"""The draft runners on the CPU double: a replayed chain of draft steps, and a replayed draft extend, give exactly
what the same steps give run one by one by hand, at every batch size, on the full and breakable doubles."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from draft_doubles import StubDraftModelRunner, draft_batch

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.config import Backend, ConfigError, PhaseConfig
from cudagraph.runner import DraftCudaGraphRunner, DraftExtendCudaGraphRunner, EagerReason, ForwardBatch

BUCKETS = (1, 2, 4, 8)
BACKENDS = (Backend.FULL, Backend.BREAKABLE)


def decode_config(buckets: tuple[int, ...] = BUCKETS) -> PhaseConfig:
    return PhaseConfig(Backend.FULL, buckets, max(buckets))


def captured_draft_runner(model_runner, kind: Backend, num_steps: int) -> DraftCudaGraphRunner:
    runner = DraftCudaGraphRunner(
        model_runner, decode_config(), num_steps=num_steps, backend=CpuReplayBackend(kind), show_progress=False
    )
    runner.capture()
    return runner


def chain_by_hand(model_runner: StubDraftModelRunner, batch: ForwardBatch, num_steps: int) -> torch.Tensor:
    """The reference: each step built from the previous one as the module docstring says, run eagerly."""
    table = model_runner.req_to_token_pool.req_to_token
    tokens, step = [], batch
    for index in range(num_steps):
        logits, hidden = model_runner.draft_forward(step, model_runner.step_attn_backends[index])
        token = logits.argmax(-1)
        tokens.append(token)
        positions = batch.positions + index + 1
        step = dataclasses.replace(
            batch,
            input_ids=token,
            positions=positions,
            seq_lens=batch.seq_lens + index + 1,
            out_cache_loc=table[batch.req_pool_indices, positions].long(),
            hidden_states=hidden,
        )
    return torch.stack(tokens, dim=1)


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("num_steps", [1, 3])
def test_a_replayed_draft_chain_equals_the_chain_run_by_hand_at_every_size(kind: Backend, num_steps: int) -> None:
    model_runner = StubDraftModelRunner()
    runner = captured_draft_runner(model_runner, kind, num_steps)
    assert runner.captured_buckets == BUCKETS
    for size in range(1, max(BUCKETS) + 1):
        batch = draft_batch(model_runner, size, seed=size)
        expected = chain_by_hand(model_runner, batch, num_steps)
        drafted = runner.replay(batch)
        assert drafted.shape == (size, num_steps)
        assert torch.equal(drafted, expected), f"size {size}"
        assert torch.equal(runner.draft_eagerly(batch), expected)
    assert runner.metrics.replays == max(BUCKETS)


def test_each_step_s_attention_backend_is_told_its_own_lengths_before_the_replay() -> None:
    model_runner = StubDraftModelRunner()
    runner = captured_draft_runner(model_runner, Backend.FULL, num_steps=3)
    for backend in model_runner.step_attn_backends:
        backend.replayed.clear()
    batch = draft_batch(model_runner, 3, seed=7)
    runner.replay(batch)
    for step, backend in enumerate(model_runner.step_attn_backends[:3]):
        (metadata,) = backend.replayed
        assert metadata.batch_size == 4  # 3 requests pad to the bucket of 4
        assert metadata.seq_lens[:3].tolist() == (batch.seq_lens + step).tolist()
        assert metadata.seq_lens[3].item() == 1 + step  # the padded row: the fill value, one more each step
        assert metadata.seq_lens_cpu is not None and metadata.seq_lens_cpu.tolist() == metadata.seq_lens.tolist()
        assert metadata.seq_lens_sum == int(metadata.seq_lens.sum())
    assert not model_runner.step_attn_backends[3].replayed  # a fourth backend the runner does not use


def test_a_batch_past_the_largest_bucket_drafts_eagerly_and_is_counted() -> None:
    model_runner = StubDraftModelRunner()
    runner = captured_draft_runner(model_runner, Backend.FULL, num_steps=2)
    batch = draft_batch(model_runner, 9, seed=3)
    expected = chain_by_hand(model_runner, batch, 2)
    assert torch.equal(runner.replay(batch), expected)
    assert runner.metrics.eager_count(EagerReason.TOO_LARGE) == 1


def test_bad_draft_runner_arguments_get_one_clear_error() -> None:
    model_runner = StubDraftModelRunner(steps=2)
    with pytest.raises(ConfigError, match="num_steps must be a whole number, at least 1"):
        DraftCudaGraphRunner(model_runner, decode_config(), num_steps=0, backend=CpuReplayBackend(Backend.FULL))
    with pytest.raises(ConfigError, match="num_steps must be a whole number"):
        DraftCudaGraphRunner(model_runner, decode_config(), num_steps=True, backend=CpuReplayBackend(Backend.FULL))
    with pytest.raises(ConfigError, match=r"num_steps=3 needs an attention backend per step; .* has 2"):
        DraftCudaGraphRunner(model_runner, decode_config(), num_steps=3, backend=CpuReplayBackend(Backend.FULL))
    runner = captured_draft_runner(model_runner, Backend.FULL, num_steps=2)
    batch = draft_batch(model_runner, 2)
    batch.hidden_states = None
    with pytest.raises(ValueError, match="hidden states"):
        runner.replay(batch)


# -- draft extend ---------------------------------------------------------------------------------------------------


def seed_by_hand(model_runner: StubDraftModelRunner, batch: ForwardBatch, query_len: int):
    logits, hidden = model_runner.draft_forward(batch, model_runner.attn_backend)
    assert batch.accepted_lens is not None
    rows = [r * query_len + int(a) - 1 for r, a in enumerate(batch.accepted_lens)]
    return logits[rows].argmax(-1), hidden[rows]


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_replayed_draft_extend_hands_on_each_request_s_last_real_row(kind: Backend) -> None:
    query_len = 4
    model_runner = StubDraftModelRunner()
    runner = DraftExtendCudaGraphRunner(
        model_runner, decode_config(), query_len=query_len, backend=CpuReplayBackend(kind), show_progress=False
    )
    runner.capture()
    for size in range(1, max(BUCKETS) + 1):
        batch = draft_batch(model_runner, size, query_len=query_len, seed=size)
        tokens, hidden = seed_by_hand(model_runner, batch, query_len)
        seed = runner.replay(batch)
        assert torch.equal(seed.tokens, tokens), f"size {size}"
        assert torch.allclose(seed.hidden_states, hidden, atol=1e-6)
        eager = runner.extend_eagerly(batch)
        assert torch.equal(eager.tokens, tokens)


def test_the_seed_follows_the_accepted_lengths_not_the_last_row() -> None:
    query_len = 3
    model_runner = StubDraftModelRunner()
    runner = DraftExtendCudaGraphRunner(
        model_runner, decode_config(), query_len=query_len, backend=CpuReplayBackend(Backend.FULL), show_progress=False
    )
    runner.capture()
    batch = draft_batch(model_runner, 2, query_len=query_len, seed=5, accepted=[1, 3])
    _, every_hidden = model_runner.draft_forward(batch, model_runner.attn_backend)
    seed = runner.replay(batch)
    assert torch.allclose(seed.hidden_states[0], every_hidden[0], atol=1e-6)  # request 0: its first row
    assert torch.allclose(seed.hidden_states[1], every_hidden[5], atol=1e-6)  # request 1: its third row
    assert not torch.allclose(seed.hidden_states[0], every_hidden[2], atol=1e-3)


def test_a_draft_extend_of_another_query_len_runs_eagerly_under_its_reason() -> None:
    model_runner = StubDraftModelRunner()
    runner = DraftExtendCudaGraphRunner(
        model_runner, decode_config(), query_len=3, backend=CpuReplayBackend(Backend.FULL), show_progress=False
    )
    runner.capture()
    batch = draft_batch(model_runner, 2, query_len=2, seed=1)
    tokens, _ = seed_by_hand(model_runner, batch, 2)
    assert runner.route(batch).reason is EagerReason.QUERY_LEN_NOT_CAPTURED
    with pytest.raises(ValueError, match="accepted_lens"):
        runner.replay(dataclasses.replace(batch, accepted_lens=None))
    seed = runner.extend_eagerly(batch)
    assert torch.equal(seed.tokens, tokens)
