"""tc_piecewise records a speculative verify step like a decode step: the engine's forward over ``query_len`` tokens a
request, split at the attention op, replays its recorded sequence (pieces and bound split calls) with new tokens and
equals the eager forward, keys and values included. No CUDA: the pieces run eagerly through the same sequence."""

from __future__ import annotations

import torch
import torch.fx.experimental._config as fx_config
from test_traced_forward import fresh_dynamo, make_runner, run_hidden  # noqa: F401 - fresh_dynamo: autouse reset

from cudagraph.backend import PiecewiseCompiler
from cudagraph.backend.piecewise import BindableOpCall, EagerSegments, PieceWrapper, Recordings, SplitCallWrapper
from cudagraph.backend.tc_piecewise import record_shape
from cudagraph.backend_utils import ForwardContext, ShapeDescriptor, set_forward_context
from cudagraph.engine.model_runner import ModelRunner
from cudagraph.runner import ForwardBatch, ForwardMode

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
    recordings = Recordings()
    compiler = PiecewiseCompiler(
        "eager",
        wrap_piece=lambda index, piece: PieceWrapper(index, piece, recordings),
        wrap_split=lambda index, module: SplitCallWrapper(index, module, recordings, BindableOpCall.of(module)),
    )
    compiled = torch.compile(runner.model_forward, backend=compiler, fullgraph=True)
    batch = verify_batch(runner, 3)
    kv_before = [kv.clone() for kv in runner.token_to_kv_pool.kv_buffer]
    shape = ShapeDescriptor.uniform(3, QUERY_LEN)
    with fx_config.patch(backed_size_oblivious=True):
        run_hidden(runner, batch, compiled)  # compile and warm up
        sequence, output = record_shape(shape, lambda: run_hidden(runner, batch, compiled), EagerSegments(), recordings)
    assert sequence.shape == shape and len(sequence.split_calls) == runner.model.config.num_layers

    # New tokens in the static input, the cache as it was: the replay must store and attend anew (the verify mask
    # itself is checked against step-by-step decoding in tests/runner/test_runner_verify.py).
    batch.input_ids.copy_(torch.arange(12) * 7 % runner.model.config.vocab_size)
    for kv, before in zip(runner.token_to_kv_pool.kv_buffer, kv_before, strict=True):
        kv.copy_(before)
    context = ForwardContext(forward_batch=batch, attn_backend=runner.attn_backend, extra={})
    with torch.no_grad(), set_forward_context(context):
        sequence.replay()
    replayed, kv_replayed = output.clone(), [kv.clone() for kv in runner.token_to_kv_pool.kv_buffer]
    for kv, before in zip(runner.token_to_kv_pool.kv_buffer, kv_before, strict=True):
        kv.copy_(before)
    expected = run_hidden(runner, batch, runner.model_forward)
    assert replayed.shape == (3 * QUERY_LEN, runner.model.config.hidden_size)
    torch.testing.assert_close(replayed, expected, atol=1e-5, rtol=1e-5)
    for got, want in zip(kv_replayed, runner.token_to_kv_pool.kv_buffer, strict=True):
        torch.testing.assert_close(got, want)
