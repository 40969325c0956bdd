"""The whole project: the bundled legacy example exercises the table, migrates cleanly, and its tests pass after.

The runner's mechanics (where the result goes, the patch, a re-run, the report's sections) are tested without
depending on any rule's wording: the rules decide what the messages say.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cudagraph.migrate import example
from cudagraph.migrate.command import EXIT_CHANGES, EXIT_OK, main
from cudagraph.migrate.example import DEFAULT_WORKDIR, PATCH_NAME, example_source, migrate_example
from cudagraph.migrate.renames import RenameKind, load_renames

EXAMPLE = example_source()


def _example_text() -> str:
    return "\n".join(path.read_text() for path in sorted(EXAMPLE.rglob("*.py")))


def test_the_example_exercises_every_row_of_the_legacy_shim_modules_and_every_non_module_kind() -> None:
    text = _example_text()
    missing = []
    for row in load_renames():
        if row.kind is RenameKind.MODULE:
            if row.old.startswith("cudagraph.legacy.") and row.old.rpartition(".")[2] not in text:
                missing.append(row.old)
        elif row.kind is RenameKind.SYMBOL:
            if row.old_module.startswith("cudagraph.legacy.") and not re.search(rf"\b{row.old_name}\b", text):
                missing.append(row.old)
        elif not re.search(rf"(?<![\w\-]){re.escape(row.old)}(?![\w\-])", text):
            missing.append(row.old)
    assert missing == []


@pytest.mark.slow  # its own tests in a subprocess (what `nox -s migrate` runs); the migration is checked fast below
def test_the_example_migrates_and_its_tests_pass(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cudagraph.migrate.example", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "failed: 0" in result.stdout
    assert re.search(r"\d+ passed", result.stdout)
    migrated = tmp_path / "legacy_engine"
    # Nothing migratable is left (a second migration changes nothing); what stays legacy is the platform plugin,
    # whose every legacy line is marked for a manual step, which --strict fails on.
    assert main([str(migrated), "--check", "--no-progress"]) == EXIT_OK
    assert main([str(migrated), "--check", "--strict", "--no-progress"]) == EXIT_CHANGES
    assert re.search(r"^needs a manual step: [1-9]\d* TODO\(s\) in 1 file\(s\)", result.stdout, re.MULTILINE)
    migrated_text = "\n".join(path.read_text() for path in migrated.rglob("*.py"))
    for path in migrated.rglob("*.py"):
        lines = path.read_text().splitlines()
        for index, line in enumerate(lines):
            if "cudagraph.legacy" in line and not line.lstrip().startswith("#"):
                above = itertools.takewhile(lambda text: text.lstrip().startswith("#"), reversed(lines[:index]))
                marked = any("TODO(cudagraph-migrate)" in text for text in above)  # a TODO may be wrapped
                assert path.name.startswith("test_") or marked, (path, line)
    # The patch written beside the copy reproduces it from a pristine example.
    pristine = tmp_path / "pristine"
    shutil.copytree(example_source(), pristine, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q"], cwd=pristine, check=True)
    subprocess.run(["git", "apply", "-p1", str(tmp_path / "migration.patch")], cwd=pristine, check=True)
    for path in migrated.rglob("*.py"):
        assert (pristine / path.relative_to(migrated)).read_text() == path.read_text()
    # The engine's own forward context stayed its own.
    assert "from .forward_context import ForwardContext, get_forward_context" in migrated_text


PLUGIN = "toy_engine/platform_runner.py"
"""The example's downstream plugin whose migration needs a manual step."""


def _pristine(root: Path) -> Path:
    copy = root / "pristine"
    shutil.copytree(example_source(), copy, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    subprocess.run(["git", "init", "-q"], cwd=copy, check=True)
    return copy


def _tree(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and ".git" not in path.relative_to(root).parts and "__pycache__" not in path.parts
    }


class _Done:
    """What the patched ``subprocess.run`` returns: the example's tests passed."""

    returncode = 0


def test_the_result_stays_under_the_current_directory_with_its_patch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    ran = []
    monkeypatch.setattr(example.subprocess, "run", lambda command, cwd, check: ran.append(cwd) or _Done())
    assert example.main([]) == EXIT_OK
    workdir = tmp_path / DEFAULT_WORKDIR
    assert ran == [workdir.resolve() / "legacy_engine"]  # the example's tests run in the migrated copy
    assert sorted(path.name for path in workdir.iterdir()) == ["legacy_engine", PATCH_NAME]
    out = capsys.readouterr().out
    # both paths printed, relative to where the user stands
    assert f"migrated copy: {DEFAULT_WORKDIR}/legacy_engine\n" in out
    assert f"patch: {DEFAULT_WORKDIR}/{PATCH_NAME} " in out
    assert "replacing" not in out


def test_the_patch_is_git_apply_p1_able_from_the_examples_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    result = migrate_example(Path(DEFAULT_WORKDIR))
    printed = capsys.readouterr().out
    patch = result.patch.read_text()
    assert patch and patch in printed  # the printed patch is the written one
    headers = re.findall(r"^(---|\+\+\+) (\S+)", patch, re.MULTILINE)
    assert headers and all(name.startswith("a/" if side == "---" else "b/") for side, name in headers)
    sources = {name[2:] for _, name in headers}
    assert PLUGIN in sources and "toy_engine/model_runner.py" in sources
    assert all((example_source() / name).is_file() for name in sources)
    pristine = _pristine(tmp_path)
    applied = subprocess.run(["git", "apply", "-p1", str(result.patch.resolve())], cwd=pristine, capture_output=True)
    assert applied.returncode == 0, applied.stderr
    assert _tree(pristine) == _tree(result.copy)


def test_a_rerun_replaces_the_previous_result_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    first = migrate_example(Path(DEFAULT_WORKDIR))
    assert not first.replaced
    (first.copy / "toy_engine" / "stale.py").write_text("left from an earlier run\n")
    first.patch.write_text("stale patch\n")
    capsys.readouterr()
    second = migrate_example(Path(DEFAULT_WORKDIR))
    out = capsys.readouterr().out
    assert second.replaced and second.copy == first.copy
    assert out.splitlines()[0] == f"replacing the previous result in {DEFAULT_WORKDIR}/legacy_engine"
    assert not (second.copy / "toy_engine" / "stale.py").exists()
    assert second.patch.read_text() != "stale patch\n" and second.patch.read_text().startswith("--- a/")


def test_the_output_shows_the_plugins_manual_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    result = migrate_example(Path(DEFAULT_WORKDIR))
    out = capsys.readouterr().out.splitlines()
    plugin = f"{DEFAULT_WORKDIR}/legacy_engine/{PLUGIN}"
    todo_lines = [line for line in out if line.startswith("todo: ")]
    assert todo_lines and all(re.match(rf"todo: {re.escape(plugin)}:\d+: CG\d{{3}} \S", line) for line in todo_lines)
    summary = out[next(index for index, line in enumerate(out) if line.startswith("files scanned: ")) :]
    assert f"needs a manual step: {len(todo_lines)} TODO(s) in 1 file(s) (the todo: lines above name each place)" in (
        summary
    )
    assert f"  {plugin}: {len(todo_lines)}" in summary
    assert any(line.startswith("migrated: ") and not line.startswith("migrated: 0 ") for line in summary)
    assert any(line.startswith("listed for review: ") for line in summary)
    assert result.report.count("failed") == 0
    assert "# TODO(cudagraph-migrate):" in (result.copy / PLUGIN).read_text()


def test_without_pytest_the_example_says_what_its_tests_need(tmp_path: Path) -> None:
    """A wheel install of cudagraph-migrate alone has no pytest: the example migrates, then says so, exit 0."""
    script = (
        "import sys; sys.modules['pytest'] = None\n"  # importing pytest now fails, as where it is not installed
        "from cudagraph.migrate.example import main\n"
        f"sys.exit(main(['--workdir', {str(tmp_path)!r}]))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "No module named" not in result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].startswith(
        "the example's tests were not run: they need pytest, not installed here (pip install pytest"
    )
    assert (tmp_path / "migration.patch").read_text()
