"""The decode runner against the real engine on the CPU, through the full and breakable test doubles."""

from __future__ import annotations

import logging

import pytest
import torch
from runner_helpers import captured_runner, decode_batch, graph_config, make_model_runner

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.backend_utils import CaptureOptions
from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
from cudagraph.runner import PADDING_KV_SLOT, PADDING_REQ_POOL_INDEX, DecodeCudaGraphRunner, ForwardBatch, ForwardMode


def test_capture_goes_largest_first_and_records_stats(model_runner) -> None:
    runner, backend = captured_runner(model_runner)
    assert backend.captured_order == [8, 4, 2, 1]
    assert backend.prepared == 1
    assert runner.stats.graphs == 4
    assert [bucket.bucket for bucket in runner.stats.per_bucket] == [8, 4, 2, 1]
    assert runner.stats.seconds > 0


@pytest.mark.parametrize("backend_kind", [Backend.FULL, Backend.BREAKABLE])
@pytest.mark.parametrize("batch_size", [1, 2, 3, 5, 8])
def test_replay_matches_eager_and_uses_the_padded_bucket(batch_size: int, backend_kind: Backend) -> None:
    model_runner = make_model_runner()
    runner, backend = captured_runner(model_runner, backend_kind=backend_kind)
    batch = decode_batch(model_runner, batch_size)
    eager = model_runner.forward(batch).clone()
    replayed = runner.replay(batch)
    assert backend.replayed == [runner.pad_to_bucket(batch_size)]
    assert replayed.shape == eager.shape == (batch_size, model_runner.model.config.vocab_size)
    torch.testing.assert_close(replayed, eager, rtol=1e-5, atol=1e-5)
    assert torch.equal(replayed.argmax(-1), eager.argmax(-1))


def test_padded_rows_point_at_scratch_after_a_larger_batch(model_runner) -> None:
    runner, _ = captured_runner(model_runner)
    large = decode_batch(model_runner, 8, seed=1)
    runner.replay(large)
    small = ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=3,
        input_ids=large.input_ids[:3],
        positions=large.positions[:3],
        seq_lens=large.seq_lens[:3],
        req_pool_indices=large.req_pool_indices[:3],
        out_cache_loc=large.out_cache_loc[:3],
        seq_lens_sum=int(large.seq_lens_cpu[:3].sum()),
        seq_lens_cpu=large.seq_lens_cpu[:3],
    )
    k_before = model_runner.token_to_kv_pool.k_buffer[0].clone()
    runner.replay(small)
    static = runner.static_buffers.tensors
    fill = model_runner.attn_backend.get_cuda_graph_seq_len_fill_value()
    assert static["out_cache_loc"][3:8].tolist() == [PADDING_KV_SLOT] * 5
    assert static["req_pool_indices"][3:8].tolist() == [PADDING_REQ_POOL_INDEX] * 5
    assert static["seq_lens"][3:8].tolist() == [fill] * 5
    assert static["req_pool_indices"][:3].tolist() == large.req_pool_indices[:3].tolist()
    # Only the three real tokens' slots and the scratch slot may change; the other five requests' KV must not.
    changed = (model_runner.token_to_kv_pool.k_buffer[0] != k_before).any(dim=(1, 2)).nonzero().flatten().tolist()
    assert set(changed) <= {PADDING_KV_SLOT, *large.out_cache_loc[:3].tolist()}


def test_batches_it_cannot_take_run_eagerly(model_runner) -> None:
    runner, backend = captured_runner(model_runner)
    too_large = decode_batch(model_runner, 9)
    assert not runner.can_run(too_large)
    eager = model_runner.forward(too_large).clone()
    torch.testing.assert_close(runner.replay(too_large), eager)
    assert backend.replayed == []
    extend = ForwardBatch(
        ForwardMode.EXTEND,
        1,
        too_large.input_ids[:1],
        too_large.positions[:1],
        too_large.seq_lens[:1],
        too_large.req_pool_indices[:1],
        too_large.out_cache_loc[:1],
        0,
    )
    assert not runner.can_run(extend)


def test_disable_padding_takes_only_exact_buckets() -> None:
    model_runner = make_model_runner(config=graph_config(disable_padding=True))
    runner, _ = captured_runner(model_runner)
    assert runner.can_run(decode_batch(model_runner, 4))
    assert not runner.can_run(decode_batch(model_runner, 3))


def test_idle_batch_replays_the_smallest_bucket(model_runner) -> None:
    runner, backend = captured_runner(model_runner)
    empty = torch.empty(0, dtype=torch.int64)
    idle = ForwardBatch(ForwardMode.IDLE, 0, empty, empty, empty.int(), empty, empty, 0)
    assert runner.can_run(idle)
    assert runner.replay(idle).shape == (0, model_runner.model.config.vocab_size)
    assert backend.replayed == [1]


def test_an_idle_batch_runs_eagerly_without_a_runner(model_runner) -> None:
    empty = torch.empty(0, dtype=torch.int64)
    idle = ForwardBatch(ForwardMode.IDLE, 0, empty, empty, empty.int(), empty, empty, 0)
    assert model_runner.run(idle).shape == (0, model_runner.model.config.vocab_size)


def test_not_captured_runner_cannot_run_and_recapture_after_shutdown_works(model_runner) -> None:
    backend = CpuReplayBackend()
    runner = DecodeCudaGraphRunner(model_runner, model_runner.cuda_graph_config, backend=backend, show_progress=False)
    batch = decode_batch(model_runner, 2)
    assert not runner.can_run(batch)
    runner.capture()
    first = runner.replay(batch).clone()
    runner.shutdown()
    assert backend.cleaned == 1 and not runner.captured and not runner.can_run(batch)
    runner.capture()
    torch.testing.assert_close(runner.replay(batch), first)


def test_a_runner_for_a_disabled_phase_is_a_caller_bug_not_a_second_decision(model_runner) -> None:
    """The config decides that a phase runs eagerly; a runner asserts it was not made for one (no message of its
    own for users: they read the config's)."""
    config = CudaGraphConfig(
        decode=PhaseConfig(Backend.DISABLED, (), 0), prefill=PhaseConfig(Backend.BREAKABLE, (16,), 16)
    )
    with pytest.raises(AssertionError, match="a decode runner for a phase the config does not graph"):
        DecodeCudaGraphRunner(model_runner, config, backend=CpuReplayBackend())


def test_model_runner_on_cpu_says_graphs_need_cuda_and_runs_eagerly(model_runner, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        assert model_runner.init_decode_cuda_graph() is None
        assert model_runner.init_prefill_cuda_graph() is None
    assert "CUDA graphs need a CUDA device" in caplog.text
    assert model_runner.decode_cuda_graph_runner is None
    batch = decode_batch(model_runner, 2)
    torch.testing.assert_close(model_runner.run(batch), model_runner.forward(batch))


def test_capture_stats_describe_the_latest_capture_only(model_runner) -> None:
    runner, _ = captured_runner(model_runner)
    first = runner.stats
    runner.shutdown()
    runner.capture()
    assert first.graphs == runner.stats.graphs == 4
    assert [bucket.bucket for bucket in runner.stats.per_bucket] == [8, 4, 2, 1]
    # The total is measured around the whole capture: never less than its shapes.
    assert runner.stats.seconds >= sum(bucket.seconds for bucket in runner.stats.per_bucket) > 0


def test_breakable_replay_is_one_segment_more_than_attention_breaks(model_runner) -> None:
    runner, backend = captured_runner(model_runner, backend_kind=Backend.BREAKABLE)
    layers = model_runner.shape.num_layers
    for bucket in runner.buckets:
        tape = backend.entry(bucket).graph
        assert (tape.num_segments, tape.num_eager_calls) == (layers + 1, layers)


def test_debug_mode_catches_a_static_buffer_that_moved(model_runner) -> None:
    runner, _ = captured_runner(model_runner, options=CaptureOptions(debug=True))
    batch = decode_batch(model_runner, 3)
    runner.replay(batch)  # buffers in place: fine
    # Rebinding a buffer (instead of copying into it) leaves the graph reading the old memory.
    runner.static_buffers.tensors["positions"] = runner.static_buffers.tensors["positions"].clone()
    with pytest.raises(RuntimeError, match="static inputs are not where the graph was captured"):
        runner.replay(batch)


def test_the_capture_bar_says_what_it_captures_in_sglangs_words(model_runner, capsys) -> None:
    runner = DecodeCudaGraphRunner(model_runner, model_runner.cuda_graph_config, backend=CpuReplayBackend(Backend.FULL))
    runner.capture()
    bar = capsys.readouterr().err
    for batch_size in (8, 4, 2, 1):
        assert f"Capturing batches (bs={batch_size} avail_mem=" in bar


def test_profile_capture_writes_a_trace_of_the_largest_capture_and_logs_its_path(model_runner, caplog) -> None:
    import dataclasses
    import json

    config = dataclasses.replace(model_runner.cuda_graph_config, profile_capture=True)
    runner = DecodeCudaGraphRunner(model_runner, config, backend=CpuReplayBackend(Backend.FULL), show_progress=False)
    with caplog.at_level(logging.INFO, logger="cudagraph.runner"):
        runner.capture()
    assert runner.profile_trace is not None
    try:
        trace = json.loads(runner.profile_trace.read_text())
        assert trace["traceEvents"], "the trace holds the capture's events"
        assert f"capture of bucket 8: {runner.profile_trace}" in caplog.text
    finally:
        runner.profile_trace.unlink()
    plain = DecodeCudaGraphRunner(model_runner, model_runner.cuda_graph_config, backend=CpuReplayBackend(Backend.FULL))
    plain.capture()
    assert plain.profile_trace is None


def test_a_model_that_does_not_trace_falls_back_to_eager_with_one_warning(model_runner, caplog) -> None:
    from cudagraph.backend import ModelTraceError

    class UntraceableBackend(CpuReplayBackend):
        def prepare(self, model_forward, entries) -> None:
            raise ModelTraceError("model_forward (model.py:12): graph break: Tensor.item()")

    runner = DecodeCudaGraphRunner(
        model_runner, model_runner.cuda_graph_config, backend=UntraceableBackend(Backend.FULL), show_progress=False
    )
    with caplog.at_level(logging.WARNING, logger="cudagraph.runner"):
        runner.capture()
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "every decode step runs eagerly" in warnings[0].getMessage()
    assert "Tensor.item()" in (runner.eager_reason or "")
    batch = decode_batch(model_runner, 3)
    assert not runner.can_run(batch)
    torch.testing.assert_close(runner.replay(batch), model_runner.forward(batch))
