"""The ``lifecycle`` section on CPU, over fabricated rows: they round-trip JSON (and results written before the
section still load), the report prints them, each of its five targets is met, missed or not measured as its figures
say, compare follows its ratios in their directions, merge keeps its rows; the section's settings say what it
captures, the profiles name its presets, and on a machine without CUDA it is skipped with the reason. Then
``bench/bench_lifecycle.py``'s options: the section's settings they make, what it refuses, and the harness JSON it
writes (the measuring itself replaced: its first real run is a device run)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import bench_lifecycle
import pytest
from harness import cli
from harness import lifecycle as section
from harness.compare import ratios_of, regressions
from harness.merge import merge_results
from harness.profiles import PROFILES
from harness.report import format_report
from harness.rows import BenchResult, LifecycleRow
from harness.targets import LIFECYCLE_TARGETS, SLEEP_TARGETS, TARGETS, check_targets
from hypothesis import given
from hypothesis import strategies as st
from results_factory import json_round_trip, lifecycle_rows, result_with, target_verdicts

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
RATIO_NAMES = ("lazy_over_eager", "freed_share", "wake_over_first_capture", "after_over_before")


def lifecycle_verdicts(rows: list[LifecycleRow]) -> list[bool | None]:
    return target_verdicts(result_with(lifecycle=rows), LIFECYCLE_TARGETS)


def test_rows_round_trip_json_with_their_ratios_derived_not_stored() -> None:
    result = result_with(lifecycle=lifecycle_rows())
    again = json_round_trip(result)
    assert again.lifecycle == result.lifecycle
    qwen = again.lifecycle[0]
    assert qwen.lazy_over_eager == pytest.approx(0.12 / 1.67)
    assert qwen.freed_share == pytest.approx(6.9 / 7, rel=1e-6)
    assert qwen.wake_over_first_capture == pytest.approx(0.61 / 0.65)
    assert qwen.after_over_before == pytest.approx(0.99)
    stored = result.to_dict()["lifecycle"][0]
    assert not set(RATIO_NAMES) & set(stored)
    assert stored["startup_s"] == {"eager": 1.67, "lazy": 0.12} and stored["recaptured"] == []


def test_a_figure_not_measured_gives_no_ratio() -> None:
    # The 2026-11-28 file's reading before capture was wrong (negative): no share is better than a false one.
    [row, _] = lifecycle_rows(graph_and_kv_bytes=-146685952, startup_s={"lazy": 0.12}, first_capture_s=0.0)
    assert (row.freed_share, row.lazy_over_eager, row.wake_over_first_capture) == (None, None, None)
    assert row.after_over_before is not None


def test_a_result_written_before_the_section_still_loads() -> None:
    [older, *_] = sorted(RESULTS.glob("*-bench*.json"))
    data = json.loads(older.read_text())
    assert "lifecycle" not in data
    assert BenchResult.from_dict(data).lifecycle == []


def lifecycle_table(rows: list[LifecycleRow]) -> list[str]:
    text = format_report(result_with(lifecycle=rows))
    return text.split("== Decode graphs across an engine's life\n\n", 1)[1].split("\n\n")[0].splitlines()


def test_report_prints_the_table() -> None:
    header, *lines = lifecycle_table(lifecycle_rows())
    assert header.split()[:9] == [
        "preset", "backend", "buckets", "start-up", "eager", "s", "lazy", "s", "lazy/eager",
    ]  # fmt: skip
    assert len(lines) == 2
    cells = lines[0].split()
    assert cells[:10] == ["qwen3-0.6b", "full", "35", "1.67", "0.12", "0.072x", "94.2", "0.65", "0.61", "0.938x"]
    assert cells[10:] == ["6.900", "7.000", "98.6%", "1226.0", "1213.7", "0.990x", "none"]
    _, line = lifecycle_table(lifecycle_rows(graph_and_kv_bytes=0, recaptured=[8, 16])[:1])
    cells = line.split()
    assert (cells[-6], cells[-5], cells[-1]) == ("0.000", "-", "8,16")


def test_the_sample_meets_the_five_targets() -> None:
    targets = check_targets(result_with(lifecycle=lifecycle_rows()), LIFECYCLE_TARGETS)
    assert [target.met for target in targets] == [True] * 5
    assert "qwen3-0.6b full 0.072x eager's; llama-3-8b full 0.038x eager's" in targets[0].detail
    assert set(LIFECYCLE_TARGETS) <= set(TARGETS)  # a whole run's --check states them too


@pytest.mark.parametrize(
    ("changes", "missed"),
    [
        ({"startup_s": {"eager": 1.0, "lazy": 0.26}}, 0),
        ({"first_use_capture_ms": 100.5}, 1),
        ({"sleep_freed_bytes": int(0.94 * 7 * 2**30)}, 2),
        ({"wake_and_first_replay_s": 0.66}, 3),
        ({"replay_us_after_update": 1226.0 * 1.06}, 4),
        ({"replay_us_after_update": 1226.0 * 0.94}, 4),
        ({"recaptured": [8]}, 4),
    ],
    ids=["lazy", "first-use", "sleep", "wake", "replay-slower", "replay-faster", "recaptured"],
)
def test_each_target_misses_when_one_row_says_so(changes: dict[str, object], missed: int) -> None:
    qwen, llama = lifecycle_rows()
    verdicts = lifecycle_verdicts([dataclasses.replace(qwen, **changes), llama])  # type: ignore[arg-type]
    assert verdicts == [index != missed for index in range(5)]


def test_targets_without_lifecycle_figures_are_not_measured() -> None:
    assert lifecycle_verdicts([]) == [None] * 5
    no_share = lifecycle_rows(graph_and_kv_bytes=0)
    assert lifecycle_verdicts(no_share) == [True, True, None, True, True]


@given(st.floats(0.5, 1.5))
def test_the_replay_target_is_met_exactly_within_5_percent_either_way(ratio: float) -> None:
    [row, _] = lifecycle_rows()
    after = dataclasses.replace(row, replay_us_before=1000.0, replay_us_after_update=1000.0 * ratio)
    assert lifecycle_verdicts([after])[4] is (abs(after.replay_us_after_update / 1000.0 - 1.0) <= 0.05)


@given(st.floats(0.01, 10.0), st.floats(0.01, 10.0))
def test_the_lazy_target_is_met_exactly_at_a_quarter_or_less(eager: float, lazy: float) -> None:
    [row, _] = lifecycle_rows()
    verdict = lifecycle_verdicts([dataclasses.replace(row, startup_s={"eager": eager, "lazy": lazy})])[0]
    assert verdict is (lazy / eager <= 0.25)


@pytest.mark.parametrize(
    ("changes", "flagged"),
    [
        ({"startup_s": {"eager": 1.67, "lazy": 0.14}}, "lazy_over_eager"),
        ({"sleep_freed_bytes": int(0.8 * 7 * 2**30)}, "freed_share"),
        ({"wake_and_first_replay_s": 0.72}, "wake_over_first_capture"),
        ({"replay_us_after_update": 1226.0 * 1.12}, "after_over_before"),
        ({"startup_s": {"eager": 1.67, "lazy": 0.06}, "wake_and_first_replay_s": 0.3}, None),
        ({"replay_us_after_update": 1226.0 * 1.05}, None),
    ],
)
def test_compare_flags_each_ratio_more_than_10_percent_worse_in_its_direction(
    changes: dict[str, object], flagged: str | None
) -> None:
    old = result_with(lifecycle=lifecycle_rows())
    qwen, llama = lifecycle_rows()
    new = result_with(lifecycle=[dataclasses.replace(qwen, **changes), llama])  # type: ignore[arg-type]
    keys = {f"lifecycle/{preset}/full/{name}" for preset in ("qwen3-0.6b", "llama-3-8b") for name in RATIO_NAMES}
    assert keys <= set(ratios_of(old))
    found = [regression.key for regression in regressions(old, new)]
    assert found == ([f"lifecycle/qwen3-0.6b/full/{flagged}"] if flagged else [])


def test_compare_leaves_out_a_ratio_not_measured() -> None:
    ratios = ratios_of(result_with(lifecycle=lifecycle_rows(graph_and_kv_bytes=0)))
    assert not [key for key in ratios if key.startswith("lifecycle/") and key.endswith("freed_share")]
    assert "lifecycle/llama-3-8b/full/lazy_over_eager" in ratios


def test_merge_keeps_the_rows_and_a_later_run_replaces_a_remeasured_one() -> None:
    first = BenchResult(environment={"device": "NVIDIA H100 80GB HBM3"}, settings={"run": 1})
    first.lifecycle = lifecycle_rows()
    second = BenchResult(environment=dict(first.environment), settings={"run": 2})
    remeasured = dataclasses.replace(first.lifecycle[1], first_use_capture_ms=80.0)
    other_backend = dataclasses.replace(first.lifecycle[0], backend="breakable")
    second.lifecycle = [remeasured, other_backend]
    merged = merge_results([("first.json", first), ("second.json", second)])
    assert merged.lifecycle == [first.lifecycle[0], remeasured, other_backend]


def test_profiles_name_the_section_presets() -> None:
    assert PROFILES["quick"].lifecycle_presets == ("qwen3-0.6b",)
    assert PROFILES["full"].lifecycle_presets == ("qwen3-0.6b", "llama-3-8b")


def test_settings_capture_the_default_schedule_under_each_policy_and_refuse_bad_values() -> None:
    settings = section.LifecycleSettings(("qwen3-0.6b",))
    assert section.POLICIES == ("eager", "lazy") and section.GRAPH_BACKENDS == ("full", "breakable", "tc_piecewise")
    for policy in section.POLICIES:
        config = settings.graph_config(policy)
        assert (config.decode.backend.value, config.decode.capture_policy.value) == ("full", policy)
        assert (config.decode.buckets[0], config.decode.buckets[-1]) == (1, 256)
        assert config.prefill.backend.value == "disabled"
    small = section.LifecycleSettings(("qwen3-0.6b",), backend="breakable", max_bs=32)
    assert small.graph_config("eager").decode.buckets == (1, 2, 4, 8, 16, 24, 32)
    assert settings.replay_batch in settings.graph_config("lazy").decode.buckets  # its first use captures a bucket
    assert small.cache(8).max_num_reqs == 40
    with pytest.raises(ValueError, match="'disabled' is not one of full, breakable, tc_piecewise"):
        section.LifecycleSettings(("qwen3-0.6b",), backend="disabled")
    for batch in (1, 300):
        with pytest.raises(ValueError, match=f"replay_batch {batch} must be above 1 .* at most max_bs 256"):
            section.LifecycleSettings(("qwen3-0.6b",), replay_batch=batch)


def test_the_section_is_a_default_one_and_skips_without_cuda_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reason = "CUDA is not available (test)"
    monkeypatch.setattr(cli, "cuda_unavailable_reason", lambda: reason)
    assert "lifecycle" in cli.DEFAULT_SECTIONS and cli.SECTIONS.index("lifecycle") < cli.SECTIONS.index("tp")
    assert cli.build_parser().parse_args(["--sections", "lifecycle"]).sections == ("lifecycle",)
    assert cli.main(["--quick", "--sections", "lifecycle", "--out-dir", str(tmp_path)]) == 0
    [written] = tmp_path.glob("*-bench-quick.json")
    data = json.loads(written.read_text())
    assert data["skipped"] == [{"section": "lifecycle", "what": "section", "reason": reason}]
    assert data["lifecycle"] == [] and data["settings"]["lifecycle_presets"] == ["qwen3-0.6b"]
    assert cli.main(["--quick", "--check", "--sections", "lifecycle", "--out-dir", str(tmp_path)]) == 1


def test_the_wrapper_options_make_the_section_settings() -> None:
    parser = bench_lifecycle.build_parser()
    defaults = bench_lifecycle.section_settings(parser.parse_args([]), parser)
    assert defaults == section.LifecycleSettings(("qwen3-0.6b",), attention_backend="triton")
    argv = ["--presets", "qwen3-0.6b", "llama-3-8b", "--backend", "breakable", "--max-bs", "64"]
    argv += ["--attention-backend", "torch", "--kernel-backend", "torch", "--replay-batch", "16", "--replay-steps", "5"]
    chosen = bench_lifecycle.section_settings(parser.parse_args(argv), parser)
    assert chosen == section.LifecycleSettings(
        ("qwen3-0.6b", "llama-3-8b"), "breakable", 64, "torch", "torch", replay_batch=16, replay_steps=5
    )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--presets", "gpt-2"], "invalid choice: 'gpt-2'"),
        (["--backend", "disabled"], "invalid choice: 'disabled'"),
        (["--max-bs", "0"], "expected a positive integer, got 0"),
        (["--replay-steps", "many"], "expected a positive integer, got 'many'"),
        (["--replay-batch", "1"], "replay_batch 1 must be above 1"),
        (["--max-bs", "4"], "(the engine's first step is bucket 1) and at most max_bs 4"),
    ],
)
def test_the_wrapper_refuses_bad_options_with_what_is_wrong(
    argv: list[str], says: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_lifecycle, "cuda_unavailable_reason", lambda: None)
    monkeypatch.setattr(section, "run_lifecycle", lambda result, settings: pytest.fail("measured bad options"))
    with pytest.raises(SystemExit) as exit_info:
        bench_lifecycle.main(argv)
    assert exit_info.value.code == 2
    assert says in capsys.readouterr().err


def test_the_wrapper_without_cuda_exits_2_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_lifecycle, "cuda_unavailable_reason", lambda: "CUDA is not available (test)")
    with pytest.raises(SystemExit) as exit_info:
        bench_lifecycle.main([])
    assert exit_info.value.code == 2
    assert "CUDA is not available (test)" in capsys.readouterr().err


@pytest.mark.parametrize(("recaptured", "status"), [([], 0), ([8], 1)])
def test_the_wrapper_writes_the_harness_json_and_prints_the_section_targets(
    recaptured: list[int],
    status: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = {row.preset: row for row in lifecycle_rows(recaptured=recaptured)}
    measured: list[tuple[str, section.LifecycleSettings]] = []

    def measure_preset(preset: str, settings: section.LifecycleSettings) -> LifecycleRow:
        measured.append((preset, settings))
        return rows[preset]

    monkeypatch.setattr(bench_lifecycle, "cuda_unavailable_reason", lambda: None)
    monkeypatch.setattr(section, "measure_preset", measure_preset)  # the section's own bookkeeping around it runs
    out = tmp_path / "lifecycle.json"
    assert bench_lifecycle.main(["--presets", "qwen3-0.6b", "llama-3-8b", "--out", str(out)]) == status
    assert [preset for preset, _ in measured] == ["qwen3-0.6b", "llama-3-8b"]
    assert measured[0][1] == section.LifecycleSettings(("qwen3-0.6b", "llama-3-8b"), attention_backend="triton")
    written = BenchResult.load(out)
    assert written.lifecycle == list(rows.values())
    assert written.settings["script"] == "bench_lifecycle" and written.settings["out"] == str(out)
    printed = capsys.readouterr().out
    assert "== Decode graphs across an engine's life" in printed
    target_lines = [line for line in printed.splitlines() if line.startswith(("MET ", "MISS", "SKIP"))]
    # The section's own targets, not the other sections' unmeasured ones: its five, then the sleep-mode four, which a
    # machine without sleepable memory (this one) does not measure.
    assert len(target_lines) == len(LIFECYCLE_TARGETS) + len(SLEEP_TARGETS) == 9
    assert all(line.startswith("SKIP") for line in target_lines[5:])
    target_lines = target_lines[:5]
    if recaptured:
        assert [(wrong.section, wrong.what) for wrong in written.wrong] == [
            ("lifecycle", "qwen3-0.6b full in-place update"),
            ("lifecycle", "llama-3-8b full in-place update"),
        ]
        assert target_lines[4].startswith("MISS") and "captured [8] again" in target_lines[4]
    else:
        assert written.wrong == [] and all(line.startswith("MET ") for line in target_lines)
