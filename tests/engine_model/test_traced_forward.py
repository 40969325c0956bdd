"""The engine's model forward traces whole: one dynamo graph, no graph breaks, one compilation for every token count,
and the same numbers as eager (CPU, float32)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
import torch._dynamo
import torch.fx.experimental._config as fx_config
from torch._dynamo.utils import counters

from cudagraph.backend_utils import ForwardContext, set_forward_context
from cudagraph.config import resolve
from cudagraph.engine.model import model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.runner import ForwardBatch, ForwardMode

PRESETS = ("tiny-qwen3-random", "tiny-llama-random", "tiny-qwen3-moe-random")
BATCH_SIZES = (4, 1, 7)
"""The first compiles (its token dimension marked dynamic); 1 checks that size 1 is not specialized."""


def make_runner(preset: str) -> ModelRunner:
    torch.manual_seed(0)
    model = random_model(model_config_from_preset(preset))
    return ModelRunner(model, resolve(), cache_config=CacheConfig(max_num_reqs=8, max_context_len=32))


def decode_batch(runner: ModelRunner, batch_size: int) -> ForwardBatch:
    """A decode step of ``batch_size`` requests of different lengths (their earlier KV slots already hold data)."""
    generator = torch.Generator().manual_seed(batch_size)
    lengths = torch.arange(1, batch_size + 1, dtype=torch.int64) * 3
    rows = torch.tensor([runner.req_to_token_pool.alloc() for _ in range(batch_size)], dtype=torch.int64)
    for row, length in zip(rows.tolist(), lengths.tolist(), strict=True):
        runner.req_to_token_pool.write(row, 0, runner.token_to_kv_pool.alloc(length))
    for kv in runner.token_to_kv_pool.kv_buffer:
        kv.copy_(torch.randn(kv.shape, generator=generator))
    out_cache_loc = runner.req_to_token_pool.req_to_token[rows, lengths - 1].long()
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=batch_size,
        input_ids=torch.randint(0, runner.model.config.vocab_size, (batch_size,), generator=generator),
        positions=lengths - 1,
        seq_lens=lengths,
        req_pool_indices=rows,
        out_cache_loc=out_cache_loc,
        seq_lens_sum=int(lengths.sum()),
        seq_lens_cpu=lengths,
    )


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def run_hidden(runner: ModelRunner, batch: ForwardBatch, forward: object) -> torch.Tensor:
    runner.attn_backend.init_forward_metadata(batch)
    context = ForwardContext(forward_batch=batch, attn_backend=runner.attn_backend, extra={})
    with torch.no_grad(), set_forward_context(context):
        return forward(batch.input_ids, batch.positions)  # type: ignore[operator]


def assert_compiled_matches_eager(runner: ModelRunner, compiled: object, token_counts: Sequence[int]) -> None:
    """Run ``compiled`` (the model forward under ``torch.compile``, its token dimension dynamic from the first count
    on) and the eager forward on a decode batch of each of ``token_counts``: the same hidden states, and the same KV
    cache written (the KV store is an op of the graph, not dropped as dead code)."""
    for index, batch_size in enumerate(token_counts):
        batch = decode_batch(runner, batch_size)
        if index == 0:
            torch._dynamo.mark_dynamic(batch.input_ids, 0)
            torch._dynamo.mark_dynamic(batch.positions, 0)
        kv_before = [kv.clone() for kv in runner.token_to_kv_pool.kv_buffer]
        with fx_config.patch(backed_size_oblivious=True):
            got = run_hidden(runner, batch, compiled)
        kv_compiled = [kv.clone() for kv in runner.token_to_kv_pool.kv_buffer]
        for kv, before in zip(runner.token_to_kv_pool.kv_buffer, kv_before, strict=True):
            kv.copy_(before)
        expected = run_hidden(runner, batch, runner.model_forward)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        for kv, compiled_kv in zip(runner.token_to_kv_pool.kv_buffer, kv_compiled, strict=True):
            torch.testing.assert_close(compiled_kv, kv, atol=1e-6, rtol=0)
        for row in batch.req_pool_indices.tolist():
            runner.req_to_token_pool.free(row)


@pytest.mark.parametrize("preset", PRESETS)
def test_model_forward_compiles_once_with_no_graph_breaks_and_matches_eager(preset: str) -> None:
    runner = make_runner(preset)
    compiled = torch.compile(runner.model_forward, backend="eager", fullgraph=True)
    assert_compiled_matches_eager(runner, compiled, BATCH_SIZES)
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["stats"]["calls_captured"] > 0


@pytest.mark.parametrize("preset", PRESETS)
def test_explain_sees_one_graph_and_no_breaks(preset: str) -> None:
    runner = make_runner(preset)
    batch = decode_batch(runner, 3)
    runner.attn_backend.init_forward_metadata(batch)
    context = ForwardContext(forward_batch=batch, attn_backend=runner.attn_backend, extra={})
    with torch.no_grad(), set_forward_context(context):
        explanation = torch._dynamo.explain(runner.model_forward)(batch.input_ids, batch.positions)
    assert explanation.graph_break_count == 0
    assert explanation.graph_count == 1
