"""``generate`` reports its speed: one ``speed:`` log line, and the same numbers under ``"speed"`` in ``--json``."""

from __future__ import annotations

import json
import logging

import pytest

from cudagraph.engine.commands import main
from cudagraph.engine.generate import GenerationOutput, GenerationStats
from cudagraph.engine.speed import SpeedReport, speed_report
from cudagraph.runner import CaptureStats, EagerReason, ReplayMetrics

SPEED_KEYS = {
    "prompt_tokens",
    "generated_tokens",
    "time_to_first_token_s",
    "decode_tokens_per_s",
    "total_s",
    "steps_replayed",
    "steps_eager",
    "capture_s",
    "graph_memory_bytes",
}
GENERATE = ["generate", "--preset", "tiny-qwen3-random", "--device", "cpu", "--json"]


def _generate(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main([*GENERATE, *argv]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) == {"outputs", "speed", "graph_variants"}  # graph_variants: test_engine_cli_lora.py
    speed = payload["speed"]
    assert isinstance(speed, dict) and set(speed) == SPEED_KEYS
    return speed


def test_the_json_speed_counts_the_tokens_and_steps_of_a_cpu_run(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # Two prompts prefilled in one step, then three decode steps of both: four steps, every one eager on a CPU.
    with caplog.at_level(logging.INFO, logger="cudagraph.engine"):
        speed = _generate(["--prompt-token-ids", "1,2,3", "--prompt-token-ids", "4,5", "--max-new-tokens", "4"], capsys)
    assert speed["prompt_tokens"] == 5 and speed["generated_tokens"] == 8
    assert speed["steps_replayed"] == 0 and speed["steps_eager"] == 4
    assert speed["capture_s"] == 0.0 and speed["graph_memory_bytes"] == 0
    ttft, total, decode = speed["time_to_first_token_s"], speed["total_s"], speed["decode_tokens_per_s"]
    assert isinstance(ttft, float) and isinstance(total, float) and isinstance(decode, float)
    assert 0 < ttft < total and decode > 0
    lines = [record.getMessage() for record in caplog.records if record.getMessage().startswith("speed: ")]
    assert len(lines) == 1 and lines[0].startswith("speed: 5 prompt tokens, 8 generated in ")
    assert "steps 0 replayed, 4 eager; graphs captured in 0.00 s, 0.000 GiB" in lines[0]


def test_one_new_token_has_no_decode_speed(capsys: pytest.CaptureFixture[str]) -> None:
    speed = _generate(["--prompt-token-ids", "1,2,3", "--max-new-tokens", "1"], capsys)
    assert speed["decode_tokens_per_s"] is None and speed["generated_tokens"] == 1 and speed["steps_eager"] == 1


def test_speculative_steps_count_their_accepted_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--prompt-token-ids", "1,2,3,1,2,3,1,2", "--max-new-tokens", "6", "--speculative-tokens", "2"]
    speed = _generate(argv, capsys)
    assert speed["generated_tokens"] == 6 and speed["prompt_tokens"] == 8
    assert isinstance(speed["steps_eager"], int) and 2 <= speed["steps_eager"] <= 6  # a prefill, then verify steps


def test_the_report_reads_the_loop_the_metrics_and_the_captures() -> None:
    stats = GenerationStats(seconds=2.0, first_token_s=[0.5, 1.5], decode_seconds=0.5, decode_tokens=10)
    decode = ReplayMetrics("decode")
    decode.track_buckets([None, 1, 2])
    for _ in range(7):
        decode.count_replay(1)
    prefill = ReplayMetrics("prefill")
    prefill.count_eager(EagerReason.GRAPHS_UNAVAILABLE, 5)
    prefill.count_eager(EagerReason.PHASE_DISABLED, 3)
    captures = [CaptureStats(seconds=0.25, bytes=3 * 2**20), CaptureStats(seconds=0.5, bytes=2**20)]
    outputs = [GenerationOutput([1, 2, 3]), GenerationOutput([4] * 9)]
    report = speed_report([[1, 2], [3]], outputs, stats, [decode, prefill], captures)
    assert report == SpeedReport(
        prompt_tokens=3,
        generated_tokens=12,
        time_to_first_token_s=1.0,
        decode_tokens_per_s=20.0,
        total_s=2.0,
        steps_replayed=7,
        steps_eager=2,
        capture_s=0.75,
        graph_memory_bytes=4 * 2**20,
    )
    assert report.line() == (
        "speed: 3 prompt tokens, 12 generated in 2.000 s; time to first token 1000.0 ms; decode 20.0 tokens/s; "
        "steps 7 replayed, 2 eager; graphs captured in 0.75 s, 0.004 GiB"
    )
