"""Recording one step of the engine's forward the way ``tc_piecewise`` captures it, and replaying it with new tokens,
without CUDA (the pieces run eagerly through the same sequence): what the split and verify tests share."""

from __future__ import annotations

import torch
import torch.fx.experimental._config as fx_config
from test_traced_forward import run_hidden

from cudagraph.backend import PiecewiseCompiler
from cudagraph.backend.piecewise import (
    BindableOpCall,
    EagerSegments,
    PieceWrapper,
    Recordings,
    ShapeSequence,
    SplitCallWrapper,
)
from cudagraph.backend.tc_piecewise import record_shape
from cudagraph.backend_utils import ForwardContext, ShapeDescriptor, set_forward_context
from cudagraph.engine.model_runner import ModelRunner
from cudagraph.runner import ForwardBatch


def record_step(runner: ModelRunner, batch: ForwardBatch, shape: ShapeDescriptor) -> tuple[ShapeSequence, torch.Tensor]:
    """``runner.model_forward`` compiled with recording wrappers (the eager compiler), warmed up on ``batch``, then
    recorded as ``shape``: the sequence and the static output its replay writes."""
    recordings = Recordings()
    compiler = PiecewiseCompiler(
        "eager",
        wrap_piece=lambda index, piece: PieceWrapper(index, piece, recordings),
        wrap_split=lambda index, module: SplitCallWrapper(index, module, recordings, BindableOpCall.of(module)),
    )
    compiled = torch.compile(runner.model_forward, backend=compiler, fullgraph=True)
    with fx_config.patch(backed_size_oblivious=True):
        run_hidden(runner, batch, compiled)  # compile and warm up
        return record_shape(shape, lambda: run_hidden(runner, batch, compiled), EagerSegments(), recordings)


def assert_replay_with_new_tokens_equals_eager(
    runner: ModelRunner,
    batch: ForwardBatch,
    sequence: ShapeSequence,
    output: torch.Tensor,
    kv_before: list[torch.Tensor],
    new_ids: torch.Tensor,
) -> torch.Tensor:
    """Put ``new_ids`` in the static input and the cache back as ``kv_before``, replay ``sequence``: its output and
    the keys and values it stored must equal an eager forward of the same step. Returns the replayed output."""
    batch.input_ids.copy_(new_ids % runner.model.config.vocab_size)
    for kv, before in zip(runner.token_to_kv_pool.kv_buffer, kv_before, strict=True):
        kv.copy_(before)
    context = ForwardContext(forward_batch=batch, attn_backend=runner.attn_backend, extra={})
    with torch.no_grad(), set_forward_context(context):
        sequence.replay()
    replayed, kv_replayed = output.clone(), [kv.clone() for kv in runner.token_to_kv_pool.kv_buffer]
    for kv, before in zip(runner.token_to_kv_pool.kv_buffer, kv_before, strict=True):
        kv.copy_(before)
    expected = run_hidden(runner, batch, runner.model_forward)
    torch.testing.assert_close(replayed, expected, atol=1e-5, rtol=1e-5)
    for got, want in zip(kv_replayed, runner.token_to_kv_pool.kv_buffer, strict=True):
        torch.testing.assert_close(got, want)
    return replayed
