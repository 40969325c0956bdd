"""Lean breakable replays on the real engine (CPU, breakable test double): every attention break is the backend's
bound call, so a replay dispatches no attention op, reads no forward context and calls no ``backend.forward``, and
computes exactly what the dispatched op computes. Plus what the decode hot path no longer does per step."""

from __future__ import annotations

from collections.abc import Iterator
from unittest import mock

import pytest
import torch
from runner_helpers import admit, make_model_runner, prefill_eagerly, prompts_of

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.config import Backend
from cudagraph.engine.attention import op as attention_op
from cudagraph.engine.attention import torch_backend
from cudagraph.engine.batch import make_decode_batch
from cudagraph.engine.testing import DispatchedOps, unbound_attention
from cudagraph.runner import DecodeCudaGraphRunner, ForwardBatch


@pytest.fixture
def dispatched_attention() -> Iterator[None]:
    """``unified_attention`` without its replay binder while the fixture is active (replay then calls the op)."""
    with unbound_attention():
        yield


def breakable_runner(model_runner) -> DecodeCudaGraphRunner:
    runner = DecodeCudaGraphRunner(
        model_runner, model_runner.cuda_graph_config, backend=CpuReplayBackend(Backend.BREAKABLE), show_progress=False
    )
    runner.capture()
    return runner


def decode_batch(model_runner, batch_size: int, seed: int = 0) -> ForwardBatch:
    requests = admit(model_runner, prompts_of([3 + (i % 5) for i in range(batch_size)], seed=seed))
    prefill_eagerly(model_runner, requests)
    return make_decode_batch(requests, model_runner.device)


@pytest.mark.parametrize("batch_size", [pytest.param(1, marks=pytest.mark.slow), 8])
def test_a_replay_dispatches_no_attention_op_and_reads_no_forward_context(batch_size: int) -> None:
    model_runner = make_model_runner()
    attn_backend = model_runner.attn_backend
    layers = model_runner.shape.num_layers
    with (
        mock.patch.object(attn_backend, "forward", wraps=attn_backend.forward) as forward,
        mock.patch.object(torch_backend, "_gather_and_attend", wraps=torch_backend._gather_and_attend) as kernels,
    ):
        runner = breakable_runner(model_runner)
        runs_per_bucket = runner.backend.options.num_warmups + 1  # the warm-ups and the capture run itself
        assert forward.call_count == runs_per_bucket * len(runner.buckets) * layers, "capture goes through the op"
        batch = decode_batch(model_runner, batch_size)
        forward.reset_mock()
        kernels.reset_mock()
        counter = DispatchedOps()
        context_reads = mock.patch.object(attention_op, "get_forward_context", wraps=attention_op.get_forward_context)
        with context_reads as reads, counter:
            runner.replay(batch)
        assert counter.calls["cudagraph_engine.unified_attention"] == 0
        assert forward.call_count == 0
        # The double replays segment ops through the dispatcher, store_kv among them (which reads the context; on a
        # GPU it is a node of a graph segment): every context read is one of those, none is attention's.
        assert reads.call_count == counter.calls["cudagraph_engine.store_kv"] == layers
        assert kernels.call_count == layers, "each break ran its bound gather and attention once"


@pytest.mark.parametrize("batch_size", [pytest.param(1, marks=pytest.mark.slow), 5])  # 5: padded to its bucket
def test_bound_and_dispatched_replays_give_the_same_logits_bit_for_bit(batch_size: int, request) -> None:
    bound_engine = make_model_runner()
    bound = breakable_runner(bound_engine).replay(decode_batch(bound_engine, batch_size)).clone()
    request.getfixturevalue("dispatched_attention")
    dispatched_engine = make_model_runner()
    dispatched = breakable_runner(dispatched_engine).replay(decode_batch(dispatched_engine, batch_size))
    assert torch.equal(bound, dispatched)


@pytest.mark.parametrize("backend_kind", [Backend.FULL, Backend.BREAKABLE])
def test_a_step_returns_the_logits_view_made_at_capture(backend_kind: Backend) -> None:
    model_runner = make_model_runner()
    runner = DecodeCudaGraphRunner(
        model_runner, model_runner.cuda_graph_config, backend=CpuReplayBackend(backend_kind), show_progress=False
    )
    runner.capture()
    batch = decode_batch(model_runner, 3)
    first = runner.replay(batch)
    second = runner.replay(batch)
    assert first is second, "the sliced logits are a view made once per batch size, not per step"
    assert first.shape == (3, model_runner.model.config.vocab_size)
    torch.testing.assert_close(second, model_runner.forward(batch), rtol=1e-5, atol=1e-5)


def test_loading_inputs_of_a_seen_size_builds_nothing_new() -> None:
    model_runner = make_model_runner()
    runner = breakable_runner(model_runner)
    batch = decode_batch(model_runner, 3)
    runner.replay(batch)
    views = runner.static_buffers.views(3, 3)  # the target views the load of size 3 copies into
    runner.replay(batch)
    again = runner.static_buffers.views(3, 3)
    assert all(again[name] is view for name, view in views.items()), "a seen size reuses its views"
    assert all(view.shape == (3,) for view in views.values())
