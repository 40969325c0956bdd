"""The harness command line on a machine without CUDA: the CUDA sections are skipped with the reason, the result is
written, and ``--check`` fails because the targets were not measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness import cli
from harness.cli import main
from harness.environment import device_slug, result_stem
from results_factory import sample_result, scaled


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> str:
    reason = "CUDA is not available (test)"
    monkeypatch.setattr(cli, "cuda_unavailable_reason", lambda: reason)
    return reason


def test_cuda_sections_skip_with_the_reason_and_the_json_is_written(tmp_path: Path, no_cuda: str) -> None:
    assert cli.main(["--sections", "decode,prefill", "--out-dir", str(tmp_path)]) == 0
    [written] = tmp_path.glob("*-bench.json")
    data = json.loads(written.read_text())
    assert data["skipped"] == [
        {"section": "decode", "what": "section", "reason": no_cuda},
        {"section": "prefill", "what": "section", "reason": no_cuda},
    ]
    assert data["decode"] == [] and data["settings"]["profile"] == "full"
    assert data["settings"]["kernel_counts"] == "separate"  # no decode rows here: no counting process was started
    assert data["settings"]["attention_backend"] == {"choice": "auto", "order": ["triton", "flashinfer", "torch"]}
    assert data["settings"]["kernel_backend"] == {"choice": "auto", "order": ["triton", "flashinfer", "torch"]}


@pytest.mark.parametrize(
    ("option", "unknown"), [("kernel-backend", "cutlass"), ("attention-backend", "xformers")], ids=lambda v: v
)
def test_the_backend_asked_for_defaults_to_auto_is_recorded_and_an_unknown_one_is_refused(
    option: str, unknown: str, tmp_path: Path, no_cuda: str, capsys: pytest.CaptureFixture[str]
) -> None:
    setting = option.replace("-", "_")
    assert getattr(cli.build_parser().parse_args([]), setting) == "auto"
    assert cli.main(["--sections", "decode", f"--{option}", "torch", "--out-dir", str(tmp_path)]) == 0
    [written] = tmp_path.glob("*-bench.json")
    assert json.loads(written.read_text())["settings"][setting]["choice"] == "torch"
    with pytest.raises(SystemExit):
        cli.main([f"--{option}", unknown])
    assert f"invalid choice: '{unknown}'" in capsys.readouterr().err


def test_check_fails_when_targets_are_not_measured(tmp_path: Path, no_cuda: str) -> None:
    assert cli.main(["--quick", "--check", "--sections", "decode", "--out-dir", str(tmp_path)]) == 1
    assert list(tmp_path.glob("*-bench-quick.json"))


def test_unknown_section_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--sections", "decode,warp"])
    assert "unknown section(s) ['warp']; choose from decode, breaks" in capsys.readouterr().err


def test_result_file_is_named_by_date_and_device() -> None:
    assert device_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert device_slug("NVIDIA H200") == "h200"
    assert device_slug("cpu") == "cpu"
    assert (
        result_stem({"date": "2026-11-23", "device": "NVIDIA H100 80GB HBM3"}, quick=True)
        == "2026-11-23-h100-bench-quick"
    )


@pytest.mark.parametrize(("factor", "status"), [(1.15, 1), (1.05, 0)])
def test_compare_command_exit_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], factor: float, status: int
) -> None:
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(sample_result().to_json())
    new.write_text(scaled(sample_result(), "breakable", factor).to_json())
    assert main(["compare", str(old), str(new)]) == status
    output = capsys.readouterr().out
    assert ("WORSE  decode/qwen3-0.6b/breakable/bs1/to_raw" in output) == (status == 1)


def test_batch_sizes_override_the_profile_and_must_be_positive(
    tmp_path: Path, no_cuda: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        cli.main(["--quick", "--batch-sizes", "8", "1", "8", "--sections", "decode", "--out-dir", str(tmp_path)]) == 0
    )
    [written] = tmp_path.glob("*-bench-quick.json")
    assert json.loads(written.read_text())["settings"]["batch_sizes"] == [1, 8]
    with pytest.raises(SystemExit):
        cli.main(["--batch-sizes", "0"])
    assert "must be a positive integer, got 0" in capsys.readouterr().err


def test_a_section_that_stops_the_run_leaves_the_finished_ones_on_disk(
    tmp_path: Path, no_cuda: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed (or timed out) in a later section keeps what the earlier ones measured in ``*.partial.json``."""

    def killed(result: object, args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "finish", killed)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["--sections", "decode,prefill", "--out-dir", str(tmp_path)])
    [partial] = tmp_path.glob("*-bench.partial.json")
    assert [row["section"] for row in json.loads(partial.read_text())["skipped"]] == ["decode", "prefill"]


def test_a_finished_run_removes_its_partial_file(tmp_path: Path, no_cuda: str) -> None:
    assert cli.main(["--sections", "decode", "--out-dir", str(tmp_path)]) == 0
    assert not list(tmp_path.glob("*.partial.json")) and list(tmp_path.glob("*-bench.json"))


def test_configs_select_rows_and_keep_the_references(
    tmp_path: Path, no_cuda: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.configs import DECODE_CONFIGS, PREFILL_CONFIGS, select_configs

    chosen = frozenset({"tc_piecewise/inductor", "full"})
    assert [c.name for c in select_configs(DECODE_CONFIGS, chosen)] == ["eager", "raw", "full", "tc_piecewise/inductor"]
    assert [c.name for c in select_configs(PREFILL_CONFIGS, chosen)] == ["eager", "tc_piecewise/inductor", "full"]
    assert select_configs(DECODE_CONFIGS, None) == DECODE_CONFIGS

    args = ["--quick", "--sections", "decode", "--out-dir", str(tmp_path), "--configs", "full", "tc_piecewise/eager"]
    assert cli.main(args) == 0
    [written] = tmp_path.glob("*-bench-quick.json")
    assert json.loads(written.read_text())["settings"]["configs"] == ["full", "tc_piecewise/eager"]

    assert cli.main(["--sections", "decode", "--out-dir", str(tmp_path), "--configs", "full", "fastest"]) == 2
    error = capsys.readouterr().err
    assert "unknown --configs ['fastest']; allowed: eager, raw, full," in error


@pytest.mark.parametrize("markdown", [False, True])
def test_show_prints_a_saved_results_tables_and_targets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], markdown: bool
) -> None:
    saved = tmp_path / "run.json"
    saved.write_text(sample_result().to_json())
    assert main(["show", str(saved), *(["--markdown"] if markdown else [])]) == 0
    output = capsys.readouterr().out
    assert output.startswith("device NVIDIA H100 80GB HBM3")
    assert ("| qwen3-0.6b | breakable |" in output) == markdown
    assert "decode full <= 1.03x raw replay" in output  # the targets, as the run printed them


def test_show_check_fails_on_a_missed_target_and_a_bad_file_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slow = tmp_path / "slow.json"
    slow.write_text(scaled(sample_result(), "full", 2.0).to_json())
    assert main(["show", str(slow)]) == 0
    assert main(["show", str(slow), "--check"]) == 1
    assert "MISS  decode full <= 1.03x raw replay" in capsys.readouterr().out
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert main(["show", str(broken)]) == 2
    assert capsys.readouterr().err.startswith(f"bench/run.py show: cannot read {broken}: ")
