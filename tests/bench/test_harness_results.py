"""The result schema, the stdout/markdown report and the stated targets, on a hand-built result (CPU)."""

from __future__ import annotations

import dataclasses

import pytest
from harness.report import SECTIONS, format_report
from harness.rows import ROW_TYPES, BenchResult, BreakRow
from harness.targets import check_targets
from results_factory import json_round_trip, sample_result


def test_json_round_trips_every_row_kind() -> None:
    result = sample_result()
    assert all(getattr(result, key) for key in ROW_TYPES), "the sample must hold a row of every kind"
    again = json_round_trip(result)
    assert again == result
    assert again.decode[0].floor_fraction == pytest.approx(result.decode[0].floor_ms / result.decode[0].step_ms)


def test_json_with_another_schema_version_or_unknown_field_is_refused() -> None:
    data = sample_result().to_dict()
    with pytest.raises(ValueError, match="schema_version"):
        BenchResult.from_dict({**data, "schema_version": 0})
    data["decode"][0]["speed"] = 1.0
    with pytest.raises(ValueError, match=r"decode\[0\] has unknown fields \['speed'\]"):
        BenchResult.from_dict(data)


def test_report_lists_every_row_of_every_section() -> None:
    result = sample_result()
    for markdown in (False, True):
        text = format_report(result, markdown=markdown)
        for attribute, title, _ in SECTIONS:
            assert title in text
            rows = getattr(result, attribute)
            table = text.split(title, 1)[1].split("\n\n")[1]
            assert len(table.splitlines()) == len(rows) + (2 if markdown else 1), (attribute, table)
    plain = format_report(result)
    decode_lines = [line for line in plain.splitlines() if line.startswith("qwen3-0.6b  ")]
    assert {(line.split()[1], line.split()[2]) for line in decode_lines} >= {
        (row.backend, str(row.batch_size)) for row in result.decode
    }
    assert "NVIDIA H100 80GB HBM3" in plain


def test_targets_met_on_the_sample() -> None:
    verdicts = {target.name: target.met for target in check_targets(sample_result())}
    assert verdicts == dict.fromkeys(verdicts, True) and len(verdicts) == 16


def test_each_target_misses_when_its_figures_say_so() -> None:
    result = sample_result()
    slow_full = dataclasses.replace(
        result,
        decode=[r if r.backend != "full" else dataclasses.replace(r, to_raw=1.05, step_ms=9.0) for r in result.decode],
    )
    missed = [target.name for target in check_targets(slow_full) if target.met is False]
    assert len(missed) == 2 and "1.03x raw" in missed[0] and "torch.compile" in missed[1]
    costly_breaks = dataclasses.replace(
        result, breaks=[*result.breaks[:2], BreakRow("piecewise-cuda-graphs", "model", 16, 5.0, 5.0, 1.0)]
    )
    assert [t.met for t in check_targets(costly_breaks)] == [True, False, *[True] * 14]


def test_targets_without_figures_are_skipped_not_passed() -> None:
    targets = check_targets(BenchResult())
    assert [target.met for target in targets] == [None] * 16
    assert all("not measured" in target.detail and str(target).startswith("SKIP") for target in targets)


def test_a_capture_row_says_how_far_the_estimate_was_from_the_repeat_capture() -> None:
    from harness.rows import CaptureRow

    row = CaptureRow("qwen3-0.6b", "decode", "breakable", 7, 1.7, 100 * 2**20, 0.9, 96 * 2**20, 102 * 2**20, 0.4)
    assert row.estimate_error == pytest.approx(6 / 96)
    assert CaptureRow("qwen3-0.6b", "decode", "full", 7, 1.9, 44 * 2**20).estimate_error is None
    result = BenchResult(capture=[row])
    assert json_round_trip(result).capture == [row]
    # A result written before the estimate columns existed still reads, its new figures unknown.
    old = {key: value for key, value in dataclasses.asdict(row).items() if not key.startswith(("repeat", "estimate"))}
    assert BenchResult.from_dict({"schema_version": 1, "capture": [old]}).capture[0].estimate_bytes is None
    report = format_report(result)
    assert "+6.2%" in report and "0.094" in report and "0.100" in report
