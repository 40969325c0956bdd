"""The speculative section's EAGLE draft rows on CPU: they round-trip JSON (results written before them still load),
compare flags a draft speed-up that got worse and a capture that got slower against the target's, merge keeps them,
the report prints their table, and the profiles ask for the issue's ``k``."""

from __future__ import annotations

import dataclasses
import json

import pytest
from harness.compare import ratios_of, regressions
from harness.merge import merge_results
from harness.profiles import PROFILES
from harness.report import format_report
from harness.rows import BenchResult, DraftRow
from results_factory import draft_rows, sample_result


def with_drafts(rows: list[DraftRow]) -> BenchResult:
    return dataclasses.replace(sample_result(), draft=rows)


def test_rows_round_trip_json_with_their_ratios() -> None:
    result = with_drafts(draft_rows())
    again = BenchResult.from_dict(json.loads(result.to_json()))
    assert again.draft == result.draft
    first = again.draft[0]
    assert (first.speedup, first.capture_ratio) == (pytest.approx(6.0), pytest.approx(0.5))
    assert "speedup" not in result.to_dict()["draft"][0]  # derived, never stored twice
    older = result.to_dict()
    del older["draft"]
    assert BenchResult.from_dict(older).draft == []


@pytest.mark.parametrize(
    ("graph_slower", "capture_slower", "flagged"),
    [
        (1.0, 1.0, set()),
        (1.2, 1.0, {"speedup"}),
        (1.0, 1.3, {"capture_over_decode"}),
    ],
)
def test_compare_flags_a_slower_graphed_round_or_capture(
    graph_slower: float, capture_slower: float, flagged: set[str]
) -> None:
    old = with_drafts(draft_rows())
    new = with_drafts(draft_rows(graph_slower, capture_slower))
    keys = {
        f"speculative/qwen3-0.6b/draft/1xk{k}/{what}" for k in (3, 5) for what in ("speedup", "capture_over_decode")
    }
    assert keys <= set(ratios_of(old))
    found = {regression.key for regression in regressions(old, new)}
    assert found == {f"speculative/qwen3-0.6b/draft/1xk{k}/{what}" for k in (3, 5) for what in flagged}


def test_merge_replaces_a_remeasured_row() -> None:
    first = BenchResult(environment={"device": "NVIDIA H200"}, settings={"run": 1}, draft=draft_rows())
    second = BenchResult(environment={"device": "NVIDIA H200"}, settings={"run": 2})
    second.draft = [dataclasses.replace(first.draft[1], graph_ms=1.2)]
    merged = merge_results([("first.json", first), ("second.json", second)])
    assert sorted(merged.draft, key=lambda row: row.drafts) == [first.draft[0], second.draft[0]]


def test_report_prints_the_table() -> None:
    text = format_report(with_drafts(draft_rows()))
    table = text.split("== EAGLE draft rounds (extend + k - 1 chained steps), eager vs graphed\n\n", 1)[1]
    header, *lines = table.split("\n\n")[0].splitlines()
    assert header.split()[:3] == ["preset", "k", "requests"]
    assert len(lines) == 2
    cells = lines[0].split()
    assert cells[:7] == ["qwen3-0.6b", "3", "1", "triton", "6.000", "1.000", "6.000x"]
    assert cells[-2:] == ["0.500x", "3.90"]


def test_profiles_ask_for_the_issue_s_k() -> None:
    assert PROFILES["full"].eagle_drafts == (3, 5)
    assert PROFILES["quick"].eagle_drafts == (3,)
