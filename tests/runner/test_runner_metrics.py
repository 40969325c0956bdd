"""Replay metrics: per-bucket rows, eager reasons, the one warning per window, the JSON and the table; and the
engine's model runner counting every step of a phase, with a runner or without."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from runner_helpers import admit, make_model_runner, prefill_eagerly, prompts_of

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.config import Backend, CudaGraphConfig, Phase, PhaseConfig
from cudagraph.engine.batch import make_decode_batch
from cudagraph.runner import DecodeCudaGraphRunner, EagerReason, ReplayMetrics

BUCKET_BY_SIZE = [1, 1, 2, 4, 4, 8, 8, 8, 8]
"""Buckets 1, 2, 4, 8: the bucket each size 0..8 replays."""


def metrics(window: int = 10, share: float = 0.1) -> ReplayMetrics:
    counted = ReplayMetrics(Phase.DECODE, window=window, eager_share=share)
    counted.track_buckets(BUCKET_BY_SIZE)
    return counted


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.endswith("metrics")]


def test_bucket_rows_add_up_real_and_padded_tokens() -> None:
    counted = metrics()
    for size in (3, 3, 5, 0, 1):
        counted.count_replay(size)
    rows = {row.bucket: row for row in counted.bucket_rows()}
    assert list(rows) == [1, 2, 4, 8]
    assert (rows[4].replays, rows[4].real_tokens, rows[4].padded_tokens) == (2, 6, 2)
    assert (rows[8].replays, rows[8].real_tokens, rows[8].padded_tokens) == (1, 5, 3)
    # The idle batch (size 0) ran the bucket of one: a replay of one padded row.
    assert (rows[1].replays, rows[1].real_tokens, rows[1].padded_tokens) == (2, 1, 1)
    assert rows[2].replays == 0 and rows[2].padding_percent == 0.0
    assert rows[4].padding_percent == pytest.approx(100 * 2 / 8)


def test_the_warning_comes_once_per_window_naming_the_reason_and_flag(caplog: pytest.LogCaptureFixture) -> None:
    counted = metrics(window=10, share=0.1)
    with caplog.at_level(logging.WARNING):
        # Window 1: one eager step of ten is 10 %, not more.
        counted.count_eager(EagerReason.TOO_LARGE, 9)
        for _ in range(9):
            counted.count_replay(1)
        assert warnings_of(caplog) == []
        # Window 2: the second size-eager step passes 10 % of the window; more of them stay quiet.
        counted.count_eager(EagerReason.TOO_LARGE, 9)
        counted.count_eager(EagerReason.OVER_PADDED, 5)
        assert len(warnings_of(caplog)) == 1
        for _ in range(5):
            counted.count_eager(EagerReason.TOO_LARGE, 12)
        for _ in range(3):
            counted.count_replay(2)
        warned = warnings_of(caplog)
        assert len(warned) == 1
        assert "--decode-cuda-graph-max-bs" in warned[0] and "--decode-cuda-graph-max-padding-ratio" in warned[0]
        assert "1 larger than the largest bucket" in warned[0] and "1 its bucket pads over" in warned[0]
        # Window 3: eager steps for reasons no flag fixes never warn.
        for _ in range(10):
            counted.count_eager(EagerReason.MODE_NOT_GRAPHABLE, 1)
        assert len(warnings_of(caplog)) == 1
        # A partial window closed at exit is judged by its own steps: 1 of 3 is over 10 %.
        counted.count_eager(EagerReason.NOT_A_BUCKET, 3)
        counted.count_replay(1)
        counted.count_replay(1)
        counted.close_window()
        warned = warnings_of(caplog)
    assert len(warned) == 2 and "--decode-cuda-graph-bs" in warned[1]
    assert counted.warnings == 2


step_kinds = st.sampled_from(["replay", EagerReason.TOO_LARGE, EagerReason.OVER_BUDGET, EagerReason.PHASE_DISABLED])


@given(st.lists(step_kinds, max_size=120), st.integers(1, 25), st.sampled_from([0.0, 0.1, 0.25, 0.5]))
def test_warnings_equal_the_windows_over_the_share(steps: list[object], window: int, share: float) -> None:
    counted = metrics(window=window, share=share)
    for step in steps:
        if step == "replay":
            counted.count_replay(3)
        else:
            assert isinstance(step, EagerReason)
            counted.count_eager(step, 1)
    counted.close_window()
    expected = 0
    for start in range(0, len(steps), window):
        chunk = steps[start : start + window]
        size_eager = sum(isinstance(step, EagerReason) and step.is_size_reason for step in chunk)
        # A full window is judged against its length; the last partial one, closed at exit, against its steps.
        expected += size_eager > share * len(chunk)
    assert counted.warnings == expected
    assert counted.steps == len(steps)


def test_json_and_table_say_the_same() -> None:
    counted = metrics()
    for size in (1, 3, 3):
        counted.count_replay(size)
    counted.count_eager(EagerReason.TOO_LARGE, 12)
    data = json.loads(json.dumps(counted.to_dict()))
    assert (data["phase"], data["steps"], data["replays"], data["eager"]) == ("decode", 4, 3, 1)
    assert [row["bucket"] for row in data["buckets"]] == [1, 2, 4, 8]
    assert data["eager_reasons"] == [
        {
            "reason": "too_large",
            "text": EagerReason.TOO_LARGE.text,
            "steps": 1,
            "tokens": 12,
            "hint": "raise --decode-cuda-graph-max-bs",
        }
    ]
    table = counted.table().splitlines()
    assert table[0] == "decode CUDA graphs: steps 4, replayed 3, eager 1"
    assert table[1].split(" | ") == ["bucket", "replays", "real tokens", "padded tokens", "padding %"]
    row_of_4 = next(line for line in table if line.split("|")[0].strip() == "4")
    assert [cell.strip() for cell in row_of_4.split("|")] == ["4", "2", "6", "2", "25.0"]
    assert any(EagerReason.TOO_LARGE.text in line and "--decode-cuda-graph-max-bs" in line for line in table)


def test_metrics_refuse_a_runner_of_other_buckets_once_they_counted() -> None:
    counted = metrics()
    counted.track_buckets(BUCKET_BY_SIZE)  # the same buckets again: fine
    counted.count_replay(2)
    with pytest.raises(ValueError, match="needs a ReplayMetrics of its own"):
        counted.track_buckets([1, 1, 2])


@pytest.mark.parametrize(("window", "share"), [(0, 0.1), (10, 1.0), (10, -0.1)])
def test_bad_window_settings_are_refused(window: int, share: float) -> None:
    with pytest.raises(ValueError):
        ReplayMetrics(Phase.DECODE, window=window, eager_share=share)


def test_the_model_runner_routes_once_and_counts_every_decode_step() -> None:
    """The CPU twin of the GPU padding test: buckets 1, 2, 4, 8, max_padding_ratio 1.5, batch sizes 1..10."""
    config = CudaGraphConfig(
        decode=PhaseConfig(Backend.FULL, (1, 2, 4, 8), 8, max_padding_ratio=1.5),
        prefill=PhaseConfig(Backend.DISABLED, (), 0),
    )
    model_runner = make_model_runner(config=config, max_num_reqs=64)
    decode_metrics = model_runner.cuda_graph_metrics[Phase.DECODE]
    backend = CpuReplayBackend(Backend.FULL)
    runner = DecodeCudaGraphRunner(model_runner, config, backend=backend, show_progress=False, metrics=decode_metrics)
    runner.capture()
    model_runner.decode_cuda_graph_runner = runner
    replayed = {}
    for size in range(1, 11):
        requests = admit(model_runner, prompts_of([3 + size % 4] * size, seed=size))
        prefill_eagerly(model_runner, requests)
        batch = make_decode_batch(requests, model_runner.device)
        backend.replayed.clear()
        logits = model_runner.run(batch).clone()
        replayed[size] = backend.replayed[:]
        torch.testing.assert_close(logits, model_runner.forward(batch), rtol=1e-5, atol=1e-5)
    assert replayed == {1: [1], 2: [2], 3: [4], 4: [4], 5: [], 6: [8], 7: [8], 8: [8], 9: [], 10: []}
    assert decode_metrics.eager_count(EagerReason.OVER_PADDED) == 1
    assert decode_metrics.eager_count(EagerReason.TOO_LARGE) == 2
    assert {row.bucket: row.replays for row in decode_metrics.bucket_rows()} == {1: 1, 2: 1, 4: 2, 8: 3}
    # prefill_eagerly called forward directly; the phase without a runner counted nothing.
    assert model_runner.cuda_graph_metrics[Phase.PREFILL].steps == 0


def test_a_phase_without_a_runner_counts_its_steps_under_why(model_runner) -> None:
    requests = admit(model_runner, prompts_of([4, 6]))
    from cudagraph.engine.batch import make_extend_batch

    model_runner.run(make_extend_batch(requests, model_runner.device))
    counted = model_runner.cuda_graph_metrics[Phase.PREFILL]
    # On the CPU there is no CUDA device: graphs are off whatever the config says.
    assert [(row.reason, row.steps, row.tokens) for row in counted.eager_rows()] == [
        (EagerReason.GRAPHS_UNAVAILABLE, 1, 10)
    ]
