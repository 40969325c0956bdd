"""tc_piecewise records a speculative verify step like a decode step: the engine's forward over ``query_len`` tokens a
request, split at the attention op, replays its recorded sequence (pieces and bound split calls) with new tokens and
equals the eager forward, keys and values included. No CUDA: the pieces run eagerly through the same sequence."""

from __future__ import annotations

import pytest
import torch
from piecewise_recording import assert_replay_with_new_tokens_equals_eager, record_step
from test_traced_forward import make_runner

from cudagraph.backend_utils import ShapeDescriptor
from cudagraph.engine.model_runner import ModelRunner
from cudagraph.runner import ForwardBatch, ForwardMode

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # dynamo reset between tests (conftest.py)

QUERY_LEN = 4


def verify_batch(runner: ModelRunner, requests: int) -> ForwardBatch:
    """A verify step: each request's last token and 3 drafts after ``3 * (i + 1)`` cached tokens (random cache)."""
    generator = torch.Generator().manual_seed(requests)
    cached = torch.arange(1, requests + 1, dtype=torch.int64) * 3
    seq_lens = cached + QUERY_LEN
    rows = torch.tensor([runner.req_to_token_pool.alloc() for _ in range(requests)], dtype=torch.int64)
    for row, length in zip(rows.tolist(), seq_lens.tolist(), strict=True):
        runner.req_to_token_pool.write(row, 0, runner.token_to_kv_pool.alloc(length))
    for kv in runner.token_to_kv_pool.kv_buffer:
        kv.copy_(torch.randn(kv.shape, generator=generator))
    positions = (cached[:, None] + torch.arange(QUERY_LEN)[None, :]).reshape(-1)
    token_rows = rows.repeat_interleave(QUERY_LEN)
    return ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY,
        batch_size=requests,
        input_ids=torch.randint(0, runner.model.config.vocab_size, (requests * QUERY_LEN,), generator=generator),
        positions=positions,
        seq_lens=seq_lens.int(),
        req_pool_indices=rows,
        out_cache_loc=runner.req_to_token_pool.req_to_token[token_rows, positions].long(),
        seq_lens_sum=int(seq_lens.sum()),
        seq_lens_cpu=seq_lens.int(),
    )


def test_a_recorded_verify_step_replays_with_new_tokens_as_eager() -> None:
    runner = make_runner("tiny-qwen3-random")
    batch = verify_batch(runner, 3)
    kv_before = [kv.clone() for kv in runner.token_to_kv_pool.kv_buffer]
    shape = ShapeDescriptor.uniform(3, QUERY_LEN)
    sequence, output = record_step(runner, batch, shape)
    assert sequence.shape == shape and len(sequence.split_calls) == runner.model.config.num_layers

    # New tokens in the static input, the cache as it was: the replay must store and attend anew (the verify mask
    # itself is checked against step-by-step decoding in tests/runner/test_runner_verify.py).
    new_ids = torch.arange(3 * QUERY_LEN) * 7
    replayed = assert_replay_with_new_tokens_equals_eager(runner, batch, sequence, output, kv_before, new_ids)
    assert replayed.shape == (3 * QUERY_LEN, runner.model.config.hidden_size)
