"""The command line: in-place rewrite, --diff, --check, --strict, rule selection, exclusion, failures, the summary."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cudagraph.migrate.batch_run import FileReport, RunReport
from cudagraph.migrate.command import (
    EXIT_CHANGES,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    format_finding,
    format_summary,
    main,
)
from cudagraph.migrate.renames import load_renames
from cudagraph.migrate.rules import RULES
from cudagraph.migrate.rules.base import Finding, FindingKind
from cudagraph.migrate.source_migration import migrate_source

from .fixture_cases import FIXTURES, LEGACY, MIGRATED, UNPARSABLE, expected_text, project_of


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small project: two legacy files, one clean file, one vendored directory."""
    files = {
        "pkg/server.py": LEGACY.name,
        "pkg/runner.py": "from_import_alias.in.py",
        "pkg/clean.py": "no_legacy.in.py",
        "vendor/launch.py": "cli_flags.in.py",
    }
    return project_of(tmp_path / "project", files)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def test_rewrites_in_place_by_default(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tree), "--no-progress"]) == EXIT_OK
    assert (tree / "pkg" / "server.py").read_text() == MIGRATED
    assert (tree / "pkg" / "runner.py").read_text() == expected_text(FIXTURES / "from_import_alias.in.py")
    summary = capsys.readouterr().err
    assert "files scanned: 4   parsed: 3   changed: 2   unchanged: 2   failed: 0" in summary
    assert "listed for review: 6 candidate(s)" in summary  # not launch.py's own flag definition (-v lists it)
    assert "needs a manual step: 2 TODO(s) in 1 file(s)" in summary  # server.py's, each with its comment
    # another program's command lines stay as they are unless asked
    assert (tree / "vendor" / "launch.py").read_bytes() == (FIXTURES / "cli_flags.in.py").read_bytes()
    assert main([str(tree), "--check", "--no-progress"]) == EXIT_OK
    assert main([str(tree), "--rewrite-argv", "--no-progress"]) == EXIT_OK
    assert (tree / "vendor" / "launch.py").read_text() == expected_text(FIXTURES / "cli_flags.in.py")


def test_diff_prints_a_patch_git_applies_and_writes_nothing(
    tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = tmp_path / "expected"
    shutil.copytree(tree, expected)
    assert main([str(expected), "--no-progress"]) == EXIT_OK
    monkeypatch.chdir(tree)
    before = _snapshot(tree)
    assert main(["pkg", "--diff", "--no-progress"]) == EXIT_CHANGES
    assert _snapshot(tree) == before
    diff = capsys.readouterr().out
    # outside a git repository the patch names files relative to the PATH given, and applies from there
    assert "--- a/server.py\n+++ b/server.py\n" in diff
    applied = subprocess.run(["git", "apply", "-"], input=diff, text=True, capture_output=True, cwd=tree / "pkg")
    assert applied.returncode == 0, applied.stderr
    assert _snapshot(tree) == _snapshot(expected)
    assert main(["pkg", "--diff", "--no-progress"]) == EXIT_OK  # nothing left to change
    assert capsys.readouterr().out == ""


def test_diff_of_one_file(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tree / "pkg" / "server.py"), "--diff", "--no-progress"]) == EXIT_CHANGES
    diff = capsys.readouterr().out
    assert "-    a = resolve(disable_cuda_graph=True)\n" in diff
    assert "+    a = resolve(decode_disable_cuda_graph=True, prefill_disable_cuda_graph=True)\n" in diff


def test_check_lists_the_files_and_exits_one(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _snapshot(tree)
    assert main([str(tree), "--check", "--no-progress"]) == EXIT_CHANGES
    assert _snapshot(tree) == before
    listed = capsys.readouterr().out.splitlines()
    assert listed == [f"would migrate: {tree / 'pkg' / 'runner.py'}", f"would migrate: {tree / 'pkg' / 'server.py'}"]
    assert main([str(tree / "pkg" / "clean.py"), "--check", "--no-progress"]) == EXIT_OK


def test_an_unparsable_file_is_reported_and_left_untouched(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tree / "pkg" / "broken.py"
    shutil.copy(UNPARSABLE, broken)
    assert main([str(tree), "--no-progress"]) == EXIT_ERROR == 1
    assert broken.read_bytes() == UNPARSABLE.read_bytes()
    assert (tree / "pkg" / "server.py").read_text() == MIGRATED  # the rest still migrates
    err = capsys.readouterr().err
    assert f"error: {broken}:2:" in err and "does not parse" in err
    assert "failed: 1" in err


def test_select_and_ignore_pick_rules(tree: Path) -> None:
    server = tree / "pkg" / "server.py"
    assert main([str(server), "--select", "CG402", "--rewrite-argv", "--no-progress"]) == EXIT_OK
    assert server.read_bytes() == LEGACY.read_bytes()  # no flag lists in this file
    assert main([str(tree), "--ignore", "CG4", "--rewrite-argv", "--no-progress"]) == EXIT_OK
    assert "disable_cuda_graph=True" in server.read_text()
    assert "--disable-piecewise-cuda-graph" in (tree / "vendor" / "launch.py").read_text()
    assert "from cudagraph.runner import" in (tree / "pkg" / "runner.py").read_text()
    assert main([str(tree), "--select", "legacy-keywords,CG402", "--rewrite-argv", "--no-progress"]) == EXIT_OK
    assert server.read_text() == MIGRATED
    assert "--disable-piecewise-cuda-graph" not in (tree / "vendor" / "launch.py").read_text()


def test_unknown_rule_is_an_error(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _snapshot(tree)
    assert main([str(tree), "--select", "CG999"]) == EXIT_USAGE
    assert "no rule matches 'CG999'" in capsys.readouterr().err
    assert _snapshot(tree) == before


def test_list_rules(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list-rules"]) == EXIT_OK
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == ["CG101", "CG102", "CG201", "CG301", "CG302", "CG401", "CG402", "CG403", "CG404"]


def test_exclude_skips_matching_paths(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tree), "--exclude", "vendor", "--exclude", "*/runner.py", "--no-progress"]) == EXIT_OK
    assert "--disable-piecewise-cuda-graph" in (tree / "vendor" / "launch.py").read_text()
    assert (tree / "pkg" / "runner.py").read_bytes() == (FIXTURES / "from_import_alias.in.py").read_bytes()
    assert "files scanned: 2" in capsys.readouterr().err


def test_missing_path_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nowhere"), "--no-progress"]) == EXIT_USAGE
    assert "no such file or directory" in capsys.readouterr().err


def test_summary_counts_edits_per_rule(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tree), "--check", "--no-progress"]) == EXIT_CHANGES
    rows = {line.split()[0]: line.split()[2:] for line in capsys.readouterr().err.splitlines() if line.startswith("CG")}
    # kwargs.in.py: 13 keywords rewritten (2 left for the user); cli_flags.in.py: flags only listed (no
    # --rewrite-argv); from_import_alias.in.py: 1 import statement + 1 renamed use
    assert rows["CG401"] == ["13", "1"]
    assert rows["CG402"] == ["0", "0"]
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


def test_stdin_to_stdout(monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(LEGACY.read_bytes())))
    assert main(["-", "--no-progress"]) == EXIT_OK
    assert capsysbinary.readouterr().out == MIGRATED.encode()


def test_gitignore_is_honoured(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tree / ".gitignore").write_text("vendor/\n# generated\npkg/runner.py\n")
    assert main([str(tree), "--check", "--no-progress", "--rewrite-argv"]) == EXIT_CHANGES
    out = capsys.readouterr()
    assert out.out.splitlines() == [f"would migrate: {tree / 'pkg' / 'server.py'}"]
    assert "files scanned: 2" in out.err
    assert main([str(tree), "--check", "--no-progress", "--no-gitignore"]) == EXIT_CHANGES
    assert "files scanned: 4" in capsys.readouterr().err


def test_quiet_prints_errors_only_and_verbose_lists_what_was_left_alone(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copy(FIXTURES / "attributes_tied.in.py", tree / "pkg" / "tied.py")
    assert main([str(tree), "-q", "--no-progress"]) == EXIT_OK
    assert capsys.readouterr().err == ""
    shutil.copy(FIXTURES / "attributes_tied.in.py", tree / "pkg" / "tied.py")
    assert main([str(tree), "-v", "--no-progress"]) == EXIT_OK
    err = capsys.readouterr().err
    assert "skip: " in err and ".graph_runner: receiver not tied to" in err


def test_progress_without_a_terminal_prints_one_line_per_tenth(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for index in range(20):
        (tmp_path / f"m{index}.py").write_text("x = 1\n")
    assert main([str(tmp_path)]) == EXIT_OK
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("migrating:")]
    assert lines[0] == "migrating: 2/20 files (10%)" and lines[-1] == "migrating: 20/20 files (100%)"
    assert len(lines) == 10


def test_a_result_that_would_not_import_is_never_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The post-condition: a rename table whose target does not exist makes the file fail, untouched."""
    from cudagraph.migrate.renames import renames_path

    table = tmp_path / "renames.toml"
    table.write_text(
        renames_path()
        .read_text()
        .replace('new = "cudagraph.runner.DecodeCudaGraphRunner"', 'new = "cudagraph.runner.NoSuchRunner"')
    )
    script = tmp_path / "engine.py"
    legacy = b"from cudagraph.legacy.cuda_graph_runner import CudaGraphRunner\n\nRUNNER = CudaGraphRunner\n"
    script.write_bytes(legacy)
    assert main([str(tmp_path / "engine.py"), "--renames", str(table), "--no-progress"]) == EXIT_ERROR
    assert script.read_bytes() == legacy
    err = capsys.readouterr().err
    assert "would import names that do not exist: cudagraph.runner.NoSuchRunner (line 1)" in err


def _summary(err: str) -> str:
    return err[err.index("files scanned:") :]


def test_the_summary_separates_migrated_manual_steps_and_review(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tree), "--check", "--no-progress"]) == EXIT_CHANGES
    err = capsys.readouterr().err
    summary = _summary(err).splitlines()
    headings = [line.split(":")[0] for line in summary if ":" in line and not line.startswith(" ")]
    assert headings == [
        "files scanned",
        "migrated",
        "needs a manual step",
        "listed for review",
        "maybe tied to the legacy API",
        "not tied to the legacy API",
        "accounted",
        "legacy spellings left",
    ]
    assert "migrated: 15 edit(s) in 2 file(s) (not written)" in summary
    assert any("--rewrite-argv" in line and "--rewrite-engine-options" in line for line in summary if "review" in line)
    # each file that needs a manual step is listed with as many TODOs as its todo: lines name
    listed = {
        line.strip().rpartition(": ")[0]: int(line.rpartition(": ")[2]) for line in summary if line.startswith("  ")
    }
    server, launch = str(tree / "pkg" / "server.py"), str(tree / "vendor" / "launch.py")
    assert listed == {server: err.count(f"todo: {server}:")}
    assert listed[server] > 0
    # launch.py's own parser defines a legacy flag: neither a manual step nor advised (not SGLang's parser)
    assert f"todo: {launch}:" not in err
    assert f"{launch}:21: CG402 defines legacy flag --cuda-graph-bs" not in err


def test_finding_lines_read_prefix_path_line_code(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(FIXTURES / "attributes_tied.in.py", tree / "pkg" / "tied.py")
    assert main([str(tree), "--check", "--no-progress"]) == EXIT_CHANGES
    lines = capsys.readouterr().err.splitlines()
    server, launch = re.escape(str(tree / "pkg" / "server.py")), re.escape(str(tree / "vendor" / "launch.py"))
    assert any(re.match(rf"todo: {server}:\d+: CG401 \S", line) for line in lines)
    assert any(re.match(rf"review: {launch}:\d+: CG402 argument list passes legacy flag", line) for line in lines)
    assert not [line for line in lines if line.startswith("skip: ")]  # only with -v
    assert main([str(tree), "--check", "--no-progress", "-v"]) == EXIT_CHANGES
    tied = re.escape(str(tree / "pkg" / "tied.py"))
    assert any(re.match(rf"skip: {tied}:\d+: CG201 ", line) for line in capsys.readouterr().err.splitlines())


def test_format_finding_without_a_line() -> None:
    finding = Finding(FindingKind.ARGV, "CG402", 0, "passes --cuda-graph-bs")
    assert format_finding("run.py", finding) == "review: run.py: CG402 passes --cuda-graph-bs"
    assert format_finding("run.py", replace(finding, line=7)) == "review: run.py:7: CG402 passes --cuda-graph-bs"


def test_the_rule_table_is_printed_only_with_verbose_or_when_a_rule_edited(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def table_rows(err: str) -> list[str]:
        return [line.split()[0] for line in _summary(err).splitlines() if re.match(r"CG\d{3} ", line)]

    assert main([str(tree), "--no-progress"]) == EXIT_OK
    assert table_rows(capsys.readouterr().err) == [rule.code for rule in RULES]  # edits were made: every rule a row
    assert main([str(tree), "--no-progress"]) == EXIT_OK  # nothing left to edit
    err = capsys.readouterr().err
    assert table_rows(err) == [] and "needs a manual step: " in err
    assert main([str(tree), "--no-progress", "-v"]) == EXIT_OK
    assert table_rows(capsys.readouterr().err) == [rule.code for rule in RULES]


def test_a_long_list_of_files_with_manual_steps_is_cut() -> None:
    files = [
        FileReport(f"pkg/m{index}.py", "unchanged", findings=[Finding(FindingKind.TODO, "CG201", 3, "stays")] * 2)
        for index in range(13)
    ]
    summary = format_summary(RunReport(files, RULES), written=True, max_files=10).splitlines()
    assert "needs a manual step: 26 TODO(s) in 13 file(s) (the todo: lines above name each place)" in summary
    assert [line for line in summary if line.startswith("  ")] == [
        *(f"  pkg/m{index}.py: 2" for index in range(10)),
        "  and 3 more (see above)",
    ]
    assert "migrated: 0 edit(s) in 0 file(s)" in summary
    assert not [line for line in summary if line.startswith("rule ")]


def test_strict_fails_while_manual_steps_remain(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tree), "--check", "--strict", "--no-progress"]) == EXIT_CHANGES
    # a writing run migrates everything it can, and still fails under --strict
    assert main([str(tree), "--strict", "--no-progress"]) == EXIT_CHANGES
    assert (tree / "pkg" / "server.py").read_text() == MIGRATED
    assert main([str(tree), "--check", "--no-progress"]) == EXIT_OK  # nothing migratable is left
    assert main([str(tree), "--check", "--strict", "--no-progress"]) == EXIT_CHANGES  # manual steps are
    assert "needs a manual step: 2 TODO(s) in 1 file(s)" in capsys.readouterr().err
    # without manual steps, --strict passes
    assert main([str(tree / "pkg" / "runner.py"), "--check", "--strict", "--no-progress"]) == EXIT_OK
    assert main([str(tree / "pkg" / "clean.py"), "--strict", "--no-progress"]) == EXIT_OK


def test_strict_on_stdin(monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    import io

    for argv, expected in ((["-"], EXIT_OK), (["-", "--strict"], EXIT_CHANGES), (["-", "--check", "--strict"], 1)):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(LEGACY.read_bytes())))
        assert main(argv) == expected, argv
    assert b"todo: <stdin>:" in capsysbinary.readouterr().err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO((FIXTURES / "no_legacy.in.py").read_bytes())))
    assert main(["-", "--check", "--strict"]) == EXIT_OK


def test_help_documents_the_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "--strict" in text and "exit status:" in text
    assert "--check --strict" in text


def test_a_rule_after_one_that_wrote_comments_reports_the_right_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CG102 reads the tree CG101 left, whose TODO comments pushed the code down: its finding still names the line
    of the file (the original, or with a writing run the written one), not a line of that intermediate tree."""
    source = tmp_path / "guard.py"
    text = (
        '"""A guard."""\n\nfrom sglang.srt.model_executor.cuda_graph_runner import get_is_capture_mode\n'
        "from unittest.mock import patch\n\n\ndef patched():\n"
        '    return patch("sglang.srt.model_executor.cuda_graph_runner.graph_capture", get_is_capture_mode)\n'
    )
    source.write_text(text)
    patch_line = "    return patch("
    result = migrate_source(text, str(source), RULES, load_renames())
    lines = {finding.code: finding.line for finding in result.findings}
    assert lines == {"CG101": 3, "CG102": 8}
    assert main([str(source), "--no-progress"]) == EXIT_OK
    written = source.read_text().splitlines()
    reported = {
        line.split(": ")[2].split()[0]: int(line.split(":")[2])
        for line in capsys.readouterr().err.splitlines()
        if line.startswith("todo: ")
    }
    assert written[reported["CG101"] - 1].startswith("from sglang.srt.model_executor.cuda_graph_runner import")
    assert written[reported["CG102"] - 1].startswith(patch_line)


def test_a_writing_run_reports_lines_of_the_written_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "guard.py"
    source.write_text(
        '"""A guard."""\n\nfrom sglang.srt.model_executor.cuda_graph_runner import get_is_capture_mode\n\n'
        "from sglang.srt.model_executor.cuda_graph_runner import *  # noqa: F403\n"
    )
    assert main([str(source), "--no-progress"]) == EXIT_OK
    err = capsys.readouterr().err
    written = source.read_text().splitlines()
    reported = [int(line.split(":")[2]) for line in err.splitlines() if line.startswith("todo: ")]
    assert len(reported) == 2
    for line in reported:  # each names the statement itself, below the TODO comments written above it
        assert written[line - 1].startswith("from sglang.srt.model_executor.cuda_graph_runner import")
        assert written[line - 2].startswith("#")
        above = itertools.takewhile(lambda text: text.startswith("#"), reversed(written[: line - 1]))
        assert any(text.startswith("# TODO(cudagraph-migrate):") for text in above)
