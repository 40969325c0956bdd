"""``--patch FILE`` writes what ``--diff`` prints into a file ``git apply`` takes; the summary counts parsed files."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cudagraph.migrate.command import EXIT_CHANGES, EXIT_ERROR, EXIT_OK, EXIT_USAGE, main

from .fixture_cases import LEGACY, MIGRATED, UNPARSABLE, project_of


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return project_of(tmp_path / "project", {"pkg/server.py": LEGACY.name, "pkg/clean.py": "no_legacy.in.py"})


def test_patch_writes_the_patch_to_a_file_and_nothing_to_stdout(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(project)
    patch = tmp_path / "migration.patch"
    assert main(["pkg", "--patch", str(patch), "--no-progress"]) == EXIT_CHANGES
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"patch: {patch} (1 file(s); git apply {patch})" in captured.err
    assert (project / "pkg" / "server.py").read_bytes() == LEGACY.read_bytes()  # nothing written
    applied = subprocess.run(["git", "apply", str(patch)], capture_output=True, text=True, cwd=project / "pkg")
    assert applied.returncode == 0, applied.stderr
    assert (project / "pkg" / "server.py").read_text() == MIGRATED
    # Nothing left to change: an empty patch, exit 0.
    assert main(["pkg", "--patch", str(patch), "--no-progress"]) == EXIT_OK
    assert patch.read_text() == ""


def test_patch_and_diff_together_write_the_same_patch(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(project)
    patch = tmp_path / "migration.patch"
    assert main(["pkg", "--diff", "--patch", str(patch), "--no-progress", "-q"]) == EXIT_CHANGES
    printed = capsys.readouterr().out
    assert printed and patch.read_text() == printed


def test_patch_from_stdin(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", _BinaryStdin(LEGACY.read_bytes()))
    patch = tmp_path / "stdin.patch"
    assert main(["-", "--patch", str(patch)]) == EXIT_CHANGES
    assert capsys.readouterr().out == ""
    assert "+++ b/<stdin>" in patch.read_text()


def test_patch_into_a_missing_folder_is_a_usage_error(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = project / "nowhere" / "m.patch"
    assert main([str(project), "--patch", str(target)]) == EXIT_USAGE
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"cudagraph-migrate: error: --patch {target}: the folder {target.parent} does not exist"
    )
    assert (project / "pkg" / "server.py").read_bytes() == LEGACY.read_bytes()


def test_a_file_that_does_not_parse_is_failed_not_parsed(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "pkg" / "clean.py").unlink()
    shutil.copy(UNPARSABLE, project / "pkg" / "broken.py")
    assert main([str(project), "--diff", "--no-progress"]) == EXIT_ERROR
    summary = capsys.readouterr().err
    assert "files scanned: 2   parsed: 1   would change: 1   unchanged: 0   failed: 1" in summary


class _BinaryStdin:
    def __init__(self, data: bytes) -> None:
        self.buffer = _Buffer(data)


class _Buffer:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self) -> bytes:
        return self.data
