"""The separate kernel-counting pass: which arguments it runs with, and how its counts reach the timed rows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from harness import kernel_pass
from harness.cli import build_parser
from harness.kernel_pass import KernelCounts, count_in_child, counting_argv, fill_kernel_counts
from harness.rows import BenchResult
from results_factory import decode_rows


def test_the_counting_pass_runs_decode_alone_inline_and_writes_where_it_is_told() -> None:
    argv = ["--quick", "--check", "--sections", "decode,prefill", "--presets", "qwen3-0.6b", "--out-dir", "x",
            "--kernel-counts=separate", "--configs", "full", "breakable"]  # fmt: skip
    counted = counting_argv(argv, Path("/tmp/k"))
    assert counted == [
        *("--quick", "--presets", "qwen3-0.6b", "--configs", "full", "breakable"),
        *("--sections", "decode", "--kernel-counts", "inline", "--count-only", "--out-dir", "/tmp/k"),
    ]
    args = build_parser().parse_args(counted)
    assert args.sections == ("decode",) and args.kernel_counts is KernelCounts.INLINE and args.count_only
    assert not args.check


def test_counts_fill_only_the_rows_of_the_same_preset_configuration_and_batch() -> None:
    timed = BenchResult(environment={}, settings={})
    timed.decode = [dataclasses.replace(row, kernels_per_step=None) for row in decode_rows({"full": 1.0, "raw": 1.0})]
    counted = BenchResult(environment={}, settings={})
    counted.decode = [
        dataclasses.replace(row, kernels_per_step=400.0 + row.batch_size, step_ms=99.0)
        for row in decode_rows({"full": 1.0, "breakable": 1.0}, batch_sizes=(1,))
    ]
    assert fill_kernel_counts(timed, counted) == 1
    by_key = {(row.backend, row.batch_size): row for row in timed.decode}
    assert by_key[("full", 1)].kernels_per_step == 401.0
    assert by_key[("full", 1)].step_ms != 99.0  # only the count is taken from the counting pass
    assert by_key[("full", 8)].kernels_per_step is None
    assert by_key[("raw", 1)].kernels_per_step is None


@pytest.mark.parametrize("text", ["separate", "inline", "off"])
def test_every_kernel_count_mode_parses(text: str) -> None:
    assert build_parser().parse_args(["--kernel-counts", text]).kernel_counts is KernelCounts(text)


def test_an_unknown_kernel_count_mode_is_refused_with_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--kernel-counts", "sometimes"])
    assert "separate" in capsys.readouterr().err


def test_the_child_pass_result_is_read_back_and_a_failed_pass_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_child(command: list[str]) -> int:
        out_dir = Path(command[command.index("--out-dir") + 1])
        counted = BenchResult(environment={}, settings={})
        counted.decode = [dataclasses.replace(row, kernels_per_step=7.0) for row in decode_rows({"full": 1.0})]
        (out_dir / "h100.json").write_text(counted.to_json())
        (out_dir / "h100.partial.json").write_text("not read")
        return 0

    timed = BenchResult(environment={}, settings={})
    timed.decode = [dataclasses.replace(row, kernels_per_step=None) for row in decode_rows({"full": 1.0})]
    monkeypatch.setattr(kernel_pass.subprocess, "call", fake_child)
    count_in_child(timed, ["--quick"])
    assert [row.kernels_per_step for row in timed.decode] == [7.0, 7.0]

    monkeypatch.setattr(kernel_pass.subprocess, "call", lambda command: 3)
    count_in_child(timed, ["--quick"])
    assert [(skip.section, skip.what) for skip in timed.skipped] == [("decode", "device activities per step")]
    assert "exited 3" in timed.skipped[0].reason


@pytest.mark.parametrize("count_only", [True, False])
def test_only_the_timing_run_prints_a_report_and_target_verdicts(
    count_only: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The counting pass's rows are timed under the profiler (``full`` 1.5x raw here): its output must not carry a
    table or a MISS the parent's report then contradicts; its result file is still written for the parent."""
    from harness.cli import finish

    result = BenchResult(environment={"device": "cpu", "date": "2026-11-28"}, settings={})
    result.decode = decode_rows({"raw": 1.0, "full": 1.5})
    argv = ["--quick", "--sections", "decode", "--out-dir", str(tmp_path), "--kernel-counts", "off"]
    args = build_parser().parse_args([*argv, "--count-only"] if count_only else argv)
    assert finish(result, args) == 0
    printed = capsys.readouterr().out
    assert ("MISS" in printed and "Decode step" in printed) is not count_only
    assert [path.name for path in tmp_path.glob("*.json")] != []
