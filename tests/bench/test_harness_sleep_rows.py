"""The ``lifecycle`` section's sleep-mode rows on CPU, over fabricated rows: they round-trip JSON with their ratios
derived, the report prints their table, merge keeps one row per preset, backend and level, compare follows their
ratios, and each of the four sleep targets is met, missed or not measured as the figures say (a bucket captured again
misses every one)."""

from __future__ import annotations

import dataclasses

import pytest
from harness.compare import ratios_of
from harness.merge import merge_results
from harness.report import format_report
from harness.rows import SleepRow
from harness.targets import SLEEP_TARGETS, TARGETS
from results_factory import json_round_trip, result_with, sleep_rows, target_verdicts


def verdicts(rows: list[SleepRow]) -> list[bool | None]:
    return target_verdicts(result_with(sleep=rows), SLEEP_TARGETS)


def test_rows_round_trip_json_with_their_ratios_derived_not_stored() -> None:
    result = result_with(sleep=sleep_rows())
    again = json_round_trip(result)
    assert again.sleep == result.sleep
    level_1 = again.sleep[1]
    assert level_1.freed_share == pytest.approx(8.3 / 8.2, rel=1e-6)
    assert level_1.wake_over_weight_copy == pytest.approx(0.03 / (1.2 * 2**30 / 50e9))
    assert again.sleep[0].wake_over_first_capture == pytest.approx(0.004 / 0.65)
    assert not {"freed_share", "wake_over_weight_copy"} & set(result.to_dict()["sleep"][0])


def test_the_report_prints_one_line_per_level() -> None:
    text = format_report(result_with(sleep=sleep_rows()))
    table = text.split("== Sleep mode: graphs kept across a sleep, per level\n\n", 1)[1].split("\n\n")[0]
    header, *lines = table.splitlines()
    assert header.split()[:4] == ["preset", "backend", "level", "buckets"]
    assert [line.split()[2] for line in lines] == ["0", "1", "2"]
    assert lines[1].split()[-2:] == ["1.164x", "0"]  # level 1's wake over the weights' copy, none captured again
    assert lines[0].split()[-2] == "-"  # that ratio is level 1's alone


def test_the_sample_meets_the_four_targets_and_a_whole_run_states_them() -> None:
    assert verdicts(sleep_rows()) == [True] * 4
    assert set(SLEEP_TARGETS) <= set(TARGETS)


@pytest.mark.parametrize(
    ("level", "changes", "missed"),
    [
        (0, {"freed_bytes": int(0.94 * 7 * 2**30)}, {0}),
        (2, {"freed_bytes": int(0.5 * 8.2 * 2**30)}, {0}),
        (0, {"wake_and_first_replay_s": 0.066}, {1}),
        (1, {"wake_s": 0.04}, {2}),
        (1, {"captured_again": 35}, {0, 2}),
        (2, {"captured_again": 1}, {0, 3}),
    ],
    ids=["level-0-frees", "level-2-frees", "level-0-wake", "level-1-wake", "level-1-recaptured", "level-2-recaptured"],
)
def test_each_target_misses_when_a_row_says_so(level: int, changes: dict[str, object], missed: set[int]) -> None:
    rows = sleep_rows()
    rows[level] = dataclasses.replace(rows[level], **changes)  # type: ignore[arg-type]
    assert verdicts(rows) == [index not in missed for index in range(4)]


def test_without_sleep_rows_the_targets_are_not_measured() -> None:
    assert verdicts([]) == [None] * 4
    assert verdicts(sleep_rows()[:1]) == [True, True, None, None]


def test_merge_keeps_one_row_per_level_and_compare_reads_each() -> None:
    older, newer = result_with(sleep=sleep_rows()), result_with(sleep=sleep_rows(sleep_s=0.5))
    merged = merge_results([("older.json", older), ("newer.json", newer)])
    assert [(row.level, row.sleep_s) for row in merged.sleep] == [(0, 0.5), (1, 0.5), (2, 0.5)]
    names = {name for name in ratios_of(older) if name.startswith("sleep/")}
    assert "sleep/qwen3-0.6b/full/level1/wake_over_weight_copy" in names
    assert "sleep/qwen3-0.6b/full/level0/wake_over_weight_copy" in names  # its figure exists at every level
