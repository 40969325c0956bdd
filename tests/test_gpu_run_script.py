"""``tests/gpu/run.py``'s set-up on any machine: carried wheels are unpacked once, and again only when they change."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_run_script", ROOT / "tests" / "gpu" / "run.py")
assert _spec is not None and _spec.loader is not None
gpu_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_run)


def test_carried_wheels_are_unpacked_once_and_again_when_one_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installs: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", lambda command, check: installs.append(command))
    wheels = [tmp_path / "a-1.0-py3-none-any.whl", tmp_path / "b-2.0-py3-none-any.whl"]
    for wheel in wheels:
        wheel.write_bytes(b"wheel")
    site = tmp_path / "site"
    site.mkdir()
    names = [str(wheel) for wheel in wheels]
    gpu_run.install_wheels(names, site)
    gpu_run.install_wheels(names, site)  # side by side with the first: nothing to do
    assert len(installs) == 1 and installs[0][-2:] == names
    wheels[1].write_bytes(b"a rebuilt wheel")
    gpu_run.install_wheels(names, site)
    assert len(installs) == 2, "a wheel of another size is unpacked again"


TP_FILE = "tests/gpu/engine/test_gpu_engine_tensor_parallel.py"


@pytest.mark.parametrize(
    ("argv", "reaches"),
    [
        ([], True),  # all of tests/gpu
        ([TP_FILE], True),
        ([f"{TP_FILE}::test_tp2_logits_match_tp1_within_bf16", "-x"], True),
        (["tests/gpu/engine", "-k", "tests/gpu/backend"], True),
        (["tests/gpu"], True),
        (["tests/gpu/backend", "tests/gpu/model"], False),
        (["tests/gpu/engine", f"--ignore={TP_FILE}"], False),
        (["tests/gpu/engine", "--ignore", TP_FILE], False),
        (["-k", "breakable"], True),
    ],
)
def test_the_warm_up_runs_for_selections_that_reach_the_tensor_parallel_file(argv: list[str], reaches: bool) -> None:
    assert gpu_run.reaches_tensor_parallel_file(argv) is reaches


def _run_main(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> tuple[int, list[list[str]]]:
    calls: list[list[str]] = []
    monkeypatch.setattr(gpu_run, "unavailable_reason", lambda: None)
    monkeypatch.setattr(gpu_run, "workspace_env", lambda: {})

    def call(command: list[str], env: dict[str, str], cwd: Path) -> int:
        calls.append(command)
        return 7 if command[-1].endswith("flashinfer_warmup.py") else 0

    monkeypatch.setattr(subprocess, "call", call)
    return gpu_run.main(argv), calls


def test_the_warm_up_runs_before_pytest_and_its_failure_does_not_stop_the_tests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    status, calls = _run_main(monkeypatch, [TP_FILE])
    assert len(calls) == 2 and calls[0][-1].endswith("flashinfer_warmup.py")
    assert calls[1][1:3] == ["-m", "pytest"] and calls[1][-1] == TP_FILE
    assert status == 0, "pytest's status, not the warm-up's"


def test_the_warm_up_flags_skip_it_or_run_it_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    status, calls = _run_main(monkeypatch, [TP_FILE, "--no-flashinfer-warmup"])
    assert len(calls) == 1 and calls[0][1:3] == ["-m", "pytest"] and "--no-flashinfer-warmup" not in calls[0]
    status, calls = _run_main(monkeypatch, ["--flashinfer-warmup-only"])
    assert status == 7 and len(calls) == 1 and calls[0][-1].endswith("flashinfer_warmup.py")
    _, calls = _run_main(monkeypatch, ["tests/gpu/backend"])
    assert len(calls) == 1, "a selection without the tensor-parallel file needs no warm-up"
