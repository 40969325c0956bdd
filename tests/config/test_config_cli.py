"""``python -m cudagraph.config resolve``: output modes, exit status 2 with one error line, warnings on stderr."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cudagraph.config import resolve
from cudagraph.config.resolve_command import main


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cudagraph.config", "resolve", *args], capture_output=True, text=True)


def test_json_output_matches_resolve() -> None:
    result = run("--json", "--decode-cuda-graph-max-bs", "8", "--prefill-cuda-graph-backend", "tc_piecewise")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["decode"] == "full" and data["prefill"] == "tc_piecewise"
    expected = resolve(decode_cuda_graph_max_bs=8, prefill_cuda_graph_backend="tc_piecewise").to_dict()
    assert data == expected
    assert result.stderr == ""


def test_bad_value_exits_2_with_one_line_and_no_traceback() -> None:
    result = run("--cuda-graph-mode", '{"prefill": "fulll"}', "--cuda-graph-bs", "1")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: --cuda-graph-mode: unknown backend 'fulll' for prefill; "
        "allowed backends: full, breakable, tc_piecewise, disabled"
    ]


def test_explain_and_environment_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["resolve", "--explain", "--device-type", "cpu", "--disable-piecewise-cuda-graph"]) == 0
    out, err = capsys.readouterr()
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert "rule non_cuda_device: " in lines["decode.backend"]
    assert lines["prefill.backend"].endswith("legacy flag --disable-piecewise-cuda-graph")
    assert "warning: --disable-piecewise-cuda-graph (keyword disable_piecewise_cuda_graph) is deprecated" in err


def test_plain_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["resolve", "--decode-cuda-graph-bs", "4", "2", "--prefill-disable-cuda-graph"]) == 0
    out, _ = capsys.readouterr()
    assert out.splitlines()[:2] == ["decode: full buckets=[2, 4] max=4", "prefill: disabled buckets=[] max=0"]


def test_json_with_rules_and_memory(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["resolve", "--json", "--gpu-memory-gib", "16", "--multimodal"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["decode_max_size"] == 32 and data["prefill"] == "disabled"
    assert data["sources"]["prefill.backend"].startswith("rule multimodal: ")


def test_argparse_problems_still_exit_2() -> None:
    result = run("--no-such-flag")
    assert result.returncode == 2 and "unrecognized arguments: --no-such-flag" in result.stderr


def test_compile_mode_explained_and_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["resolve", "--explain", "--torch-compile-max-bs", "8", "--torch-compile-mode", "lite"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["torch_compile_mode"].split() == ["torch_compile_mode", "lite", "flag", "--torch-compile-mode"]
    assert main(["resolve", "--explain", "--torch-compile-mode", "lite", "--decode-disable-cuda-graph"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "(unused: nothing compiles with inductor;" in lines["torch_compile_mode"]
    assert main(["resolve", "--torch-compile-mode", "reduce-overhead"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "error: --torch-compile-mode: torch.compile mode 'reduce-overhead' captures its own CUDA graphs, which would "
        "be captured inside ours; allowed: default, max-autotune-no-cudagraphs, lite"
    ]
