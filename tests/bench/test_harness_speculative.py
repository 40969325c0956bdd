"""The ``speculative`` section on CPU: its rows round-trip JSON (and results written before it still load), compare
flags a speed-up that got more than 10 % worse, merge keeps the rows, the report prints them, and the section's
settings and profiles say what it captures; on a machine without CUDA the section is skipped with the reason."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from harness import cli
from harness.compare import ratios_of, regressions
from harness.merge import merge_results
from harness.profiles import PROFILES
from harness.report import format_report
from harness.rows import BenchResult
from results_factory import json_round_trip, result_with, speculative_rows

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def test_rows_round_trip_json_with_their_shape_and_speedup() -> None:
    result = result_with(speculative=speculative_rows())
    again = json_round_trip(result)
    assert again.speculative == result.speculative
    verify, _, mixed = again.speculative
    assert (verify.shape, verify.speedup) == ("1x4", pytest.approx(6.0))
    assert (mixed.shape, mixed.drafts, mixed.speedup) == ("8+48", None, pytest.approx(2.8))
    assert "speedup" not in result.to_dict()["speculative"][0]  # derived, never stored twice


def test_a_result_written_before_the_section_still_loads() -> None:
    [older, *_] = sorted(RESULTS.glob("*-bench*.json"))
    data = json.loads(older.read_text())
    assert "speculative" not in data
    assert BenchResult.from_dict(data).speculative == []


@pytest.mark.parametrize(("slower", "flagged"), [(1.15, True), (1.05, False)])
def test_compare_flags_a_speedup_more_than_10_percent_worse(slower: float, flagged: bool) -> None:
    old, new = (
        result_with(speculative=speculative_rows()),
        result_with(speculative=speculative_rows(graph_slower=slower)),
    )
    keys = {
        "speculative/qwen3-0.6b/verify/1x4/speedup",
        "speculative/qwen3-0.6b/verify/8x4/speedup",
        "speculative/qwen3-0.6b/mixed/8+48/speedup",
    }
    assert keys <= set(ratios_of(old))
    found = {regression.key for regression in regressions(old, new)}
    assert found == (keys if flagged else set())


def test_merge_keeps_the_rows_and_a_later_run_replaces_a_remeasured_one() -> None:
    first = BenchResult(environment={"device": "NVIDIA H100 80GB HBM3"}, settings={"run": 1})
    first.speculative = speculative_rows()
    second = BenchResult(environment=dict(first.environment), settings={"run": 2})
    second.speculative = [dataclasses.replace(first.speculative[0], graph_ms=1.5)]
    merged = merge_results([("first.json", first), ("second.json", second)])
    assert sorted(merged.speculative, key=lambda row: (row.kind, row.requests)) == sorted(
        [*first.speculative[1:], second.speculative[0]], key=lambda row: (row.kind, row.requests)
    )


def test_report_prints_the_table() -> None:
    text = format_report(result_with(speculative=speculative_rows()))
    table = text.split("== Speculative verify and mixed steps, eager vs graphed\n\n", 1)[1].split("\n\n")[0]
    header, *lines = table.splitlines()
    assert header.split() == [
        "preset", "kind", "shape", "k", "tokens", "attention", "eager", "ms", "graph", "ms", "eager/graph",
        "eager", "host", "us", "graph", "host", "us",
    ]  # fmt: skip
    assert len(lines) == 3
    assert lines[0].split()[:9] == ["qwen3-0.6b", "verify", "1x4", "3", "4", "triton", "12.000", "2.000", "6.000x"]
    assert lines[2].split()[1:4] == ["mixed", "8+48", "-"]


def test_profiles_measure_the_issue_shapes() -> None:
    quick, full = PROFILES["quick"], PROFILES["full"]
    assert (quick.verify_batch_sizes, quick.speculative_drafts, quick.mixed_shapes) == ((1, 8), 3, ((8, 48),))
    assert (full.verify_batch_sizes, full.speculative_drafts, full.mixed_shapes) == ((1, 8, 32), 3, ((8, 48), (32, 96)))


def test_settings_capture_exactly_the_shapes_measured() -> None:
    from harness.speculative import SPECULATIVE_CONFIG, SpeculativeSettings

    full = PROFILES["full"]
    settings = SpeculativeSettings(
        ("qwen3-0.6b",), full.verify_batch_sizes, 3, full.mixed_shapes, full.context_len, full.iterations
    )
    assert settings.phase_shapes() == {"decode": (1, 8, 32), "prefill": (56, 128)}
    assert settings.most_requests == 33
    assert settings.cache.max_num_reqs == 35 and settings.cache.max_context_len >= full.context_len + 1 + 3
    config = SPECULATIVE_CONFIG.runner_config(settings.phase_shapes())
    assert (config.decode.backend.value, config.decode.buckets) == ("full", (1, 8, 32))
    assert (config.prefill.backend.value, config.prefill.buckets) == ("breakable", (56, 128))
    verify_only = dataclasses.replace(settings, mixed_shapes=())
    assert verify_only.phase_shapes() == {"decode": (1, 8, 32)}


def test_the_section_parses_and_skips_without_cuda_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reason = "CUDA is not available (test)"
    monkeypatch.setattr(cli, "cuda_unavailable_reason", lambda: reason)
    assert cli.build_parser().parse_args(["--sections", "speculative"]).sections == ("speculative",)
    assert cli.main(["--quick", "--sections", "speculative", "--out-dir", str(tmp_path)]) == 0
    [written] = tmp_path.glob("*-bench-quick.json")
    data = json.loads(written.read_text())
    assert data["skipped"] == [{"section": "speculative", "what": "section", "reason": reason}]
    assert data["speculative"] == []
    assert data["settings"]["verify_batch_sizes"] == [1, 8] and data["settings"]["mixed_shapes"] == [[8, 48]]
