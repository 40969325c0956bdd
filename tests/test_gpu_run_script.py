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
