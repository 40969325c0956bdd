"""The command line: in-place rewrite, --diff, --check, rule selection, exclusion, failures and the summary."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cudagraph.migrate.cli import EXIT_CHANGES, EXIT_ERROR, EXIT_OK, main

from .fixture_cases import FIXTURES

LEGACY = FIXTURES / "kwargs.in.py"
MIGRATED = FIXTURES / "kwargs.out.py"
UNPARSABLE = FIXTURES / "unparsable.bad.py"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small project: two legacy files, one clean file, one vendored directory."""
    root = tmp_path / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "vendor").mkdir()
    shutil.copy(LEGACY, root / "pkg" / "server.py")
    shutil.copy(FIXTURES / "from_import_alias.in.py", root / "pkg" / "runner.py")
    shutil.copy(FIXTURES / "no_legacy.in.py", root / "pkg" / "clean.py")
    shutil.copy(FIXTURES / "cli_flags.in.py", root / "vendor" / "launch.py")
    return root


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def test_rewrites_in_place_by_default(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tree), "--no-progress"]) == EXIT_OK
    assert (tree / "pkg" / "server.py").read_text() == MIGRATED.read_text()
    assert (tree / "pkg" / "runner.py").read_text() == (FIXTURES / "from_import_alias.out.py").read_text()
    summary = capsys.readouterr().err
    assert "files scanned: 4   changed: 3   unchanged: 1   failed: 0" in summary
    assert main([str(tree), "--check", "--no-progress"]) == EXIT_OK


def test_diff_prints_and_writes_nothing(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _snapshot(tree)
    assert main([str(tree / "pkg" / "server.py"), "--diff", "--no-progress"]) == EXIT_OK
    assert _snapshot(tree) == before
    diff = capsys.readouterr().out
    assert "-    a = resolve(disable_cuda_graph=True)\n" in diff
    assert "+    a = resolve(decode_disable_cuda_graph=True, prefill_disable_cuda_graph=True)\n" in diff


def test_check_exits_one_when_something_would_change(tree: Path) -> None:
    before = _snapshot(tree)
    assert main([str(tree), "--check", "--no-progress"]) == EXIT_CHANGES
    assert _snapshot(tree) == before
    assert main([str(tree / "pkg" / "clean.py"), "--check", "--no-progress"]) == EXIT_OK


def test_an_unparsable_file_is_reported_and_left_untouched(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tree / "pkg" / "broken.py"
    shutil.copy(UNPARSABLE, broken)
    assert main([str(tree), "--no-progress"]) == EXIT_ERROR
    assert broken.read_bytes() == UNPARSABLE.read_bytes()
    assert (tree / "pkg" / "server.py").read_text() == MIGRATED.read_text()  # the rest still migrates
    err = capsys.readouterr().err
    assert f"error: {broken}:2:" in err and "does not parse" in err
    assert "failed: 1" in err


def test_select_and_ignore_pick_rules(tree: Path) -> None:
    server = tree / "pkg" / "server.py"
    assert main([str(server), "--select", "CG402", "--no-progress"]) == EXIT_OK
    assert server.read_bytes() == LEGACY.read_bytes()  # no flag lists in this file
    assert main([str(tree), "--ignore", "CG4", "--no-progress"]) == EXIT_OK
    assert "disable_cuda_graph=True" in server.read_text()
    assert "--disable-piecewise-cuda-graph" in (tree / "vendor" / "launch.py").read_text()
    assert "from cudagraph.runner import" in (tree / "pkg" / "runner.py").read_text()
    assert main([str(tree), "--select", "legacy-keywords,CG402", "--no-progress"]) == EXIT_OK
    assert server.read_text() == MIGRATED.read_text()
    assert "--disable-piecewise-cuda-graph" not in (tree / "vendor" / "launch.py").read_text()


def test_unknown_rule_is_an_error(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _snapshot(tree)
    assert main([str(tree), "--select", "CG999"]) == EXIT_ERROR
    assert "no rule matches 'CG999'" in capsys.readouterr().err
    assert _snapshot(tree) == before


def test_list_rules(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list-rules"]) == EXIT_OK
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == ["CG101", "CG102", "CG201", "CG301", "CG302", "CG401", "CG402"]


def test_exclude_skips_matching_paths(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tree), "--exclude", "vendor", "--exclude", "*/runner.py", "--no-progress"]) == EXIT_OK
    assert "--disable-piecewise-cuda-graph" in (tree / "vendor" / "launch.py").read_text()
    assert (tree / "pkg" / "runner.py").read_bytes() == (FIXTURES / "from_import_alias.in.py").read_bytes()
    assert "files scanned: 2" in capsys.readouterr().err


def test_missing_path_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nowhere"), "--no-progress"]) == EXIT_ERROR
    assert "no such file or directory" in capsys.readouterr().err


def test_summary_counts_edits_per_rule(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tree), "--check", "--no-progress"]) == EXIT_CHANGES
    rows = {line.split()[0]: line.split()[2:] for line in capsys.readouterr().err.splitlines() if line.startswith("CG")}
    # kwargs.in.py: 13 keywords rewritten (2 left for the user); cli_flags.in.py: 10 flags in lists (not the
    # parser's own add_argument); from_import_alias.in.py: 1 import statement + 1 renamed use
    assert rows["CG401"] == ["13", "1"]
    assert rows["CG402"] == ["10", "1"]
    assert rows["CG101"] == ["2", "1"]
    assert rows["CG301"] == ["0", "0"]


def test_parallel_jobs_give_the_same_result(tree: Path, tmp_path: Path) -> None:
    serial = tmp_path / "serial"
    shutil.copytree(tree, serial)
    assert main([str(serial), "--no-progress"]) == EXIT_OK
    assert main([str(tree), "-j", "2", "--no-progress"]) == EXIT_OK
    assert _snapshot(tree) == _snapshot(serial)


def test_writes_keep_permissions_and_leave_no_temporary_files(tree: Path) -> None:
    script = tree / "pkg" / "server.py"
    os.chmod(script, 0o750)
    assert main([str(tree), "--no-progress"]) == EXIT_OK
    assert stat.S_IMODE(script.stat().st_mode) == 0o750
    assert not [path for path in tree.rglob("*") if "migrate-tmp" in path.name]


def test_console_script_runs(tree: Path) -> None:
    executable = Path(sys.executable).with_name("cudagraph-migrate")
    result = subprocess.run([str(executable), str(tree), "--check"], capture_output=True, text=True)
    assert result.returncode == EXIT_CHANGES, result.stderr


def test_line_endings_survive(tmp_path: Path) -> None:
    script = tmp_path / "crlf.py"
    script.write_bytes(b"from cudagraph.legacy.cuda_graph_runner import CudaGraphRunner\r\n\r\nx = CudaGraphRunner\r\n")
    assert main([str(script), "--no-progress"]) == EXIT_OK
    assert (
        script.read_bytes()
        == b"from cudagraph.runner import DecodeCudaGraphRunner\r\n\r\nx = DecodeCudaGraphRunner\r\n"
    )
