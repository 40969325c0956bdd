"""The edges a user meets first: patches that apply in the user's repository, what is read as Python, links kept,
usage errors for options that do not go together, one-line errors, and Ctrl-C."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cudagraph.migrate import batch_run
from cudagraph.migrate.batch_run import one_line
from cudagraph.migrate.command import EXIT_CHANGES, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, main
from cudagraph.migrate.source_migration import MigrationError

from .fixture_cases import FIXTURES, LEGACY, MIGRATED

CHECKOUT = Path(__file__).resolve().parents[2]
MIGRATE = [sys.executable, "-m", "cudagraph.migrate.command"]


def _git(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=environment, check=False)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """A git repository outside the checkout, its legacy code one folder down (``src/pkg``)."""
    root = tmp_path / "user-repo"
    (root / "src" / "pkg").mkdir(parents=True)
    shutil.copy(LEGACY, root / "src" / "pkg" / "server.py")
    shutil.copy(FIXTURES / "no_legacy.in.py", root / "src" / "pkg" / "clean.py")
    assert _git("init", "-q", cwd=root).returncode == 0
    return root


@pytest.mark.parametrize("spelling", ["absolute", "relative"])
@pytest.mark.parametrize("given", ["root", "subfolder"])
def test_diff_applies_with_git_from_the_users_repository(repository: Path, spelling: str, given: str) -> None:
    """As ``nox -s migrate -- --diff TREE | git -C TREE apply`` runs it: from the checkout, whatever the spelling."""
    tree = repository if given == "root" else repository / "src"
    argument = str(tree) if spelling == "absolute" else os.path.relpath(tree, CHECKOUT)
    migrated = subprocess.run(
        [*MIGRATE, "--diff", "--no-progress", argument], cwd=CHECKOUT, capture_output=True, text=True, check=False
    )
    assert migrated.returncode == EXIT_CHANGES, migrated.stderr
    assert "--- a/src/pkg/server.py\n+++ b/src/pkg/server.py\n" in migrated.stdout  # from the repository's top
    applied = subprocess.run(
        ["git", "-C", str(tree), "apply"], input=migrated.stdout, capture_output=True, text=True, check=False
    )
    assert applied.returncode == 0, applied.stderr
    assert (repository / "src" / "pkg" / "server.py").read_text() == MIGRATED


def test_outside_a_repository_the_patch_is_relative_to_the_path_given(tmp_path: Path) -> None:
    tree = tmp_path / "plain" / "tree"
    (tree / "pkg").mkdir(parents=True)
    shutil.copy(LEGACY, tree / "pkg" / "server.py")
    migrated = subprocess.run(
        [*MIGRATE, "--diff", "--no-progress", str(tree)], cwd=CHECKOUT, capture_output=True, text=True, check=False
    )
    assert "--- a/pkg/server.py\n" in migrated.stdout
    applied = subprocess.run(
        ["git", "-C", str(tree), "apply"], input=migrated.stdout, capture_output=True, text=True, check=False
    )
    assert applied.returncode == 0, applied.stderr
    assert (tree / "pkg" / "server.py").read_text() == MIGRATED


@pytest.mark.parametrize("argv", [["--dif"], ["--chec"], ["--rewrite-arg"]])
def test_abbreviated_options_are_usage_errors(tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]):
    shutil.copy(LEGACY, tmp_path / "server.py")
    with pytest.raises(SystemExit) as exited:
        main([*argv, str(tmp_path)])
    assert exited.value.code == EXIT_USAGE
    assert f"unrecognized arguments: {argv[0]}" in capsys.readouterr().err
    assert (tmp_path / "server.py").read_bytes() == LEGACY.read_bytes()


def test_diff_with_check_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(LEGACY, tmp_path / "server.py")
    assert main(["--diff", "--check", str(tmp_path)]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines()[-1] == (
        "cudagraph-migrate: error: --diff and --check cannot be combined: --diff prints the patch, --check lists the "
        "files"
    )


def test_only_python_files_are_read_as_python(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_bytes(LEGACY.read_bytes())
    stub = tmp_path / "server.pyi"
    stub.write_bytes(LEGACY.read_bytes())
    assert main([str(tmp_path), "--no-progress"]) == EXIT_OK
    assert notes.read_bytes() == LEGACY.read_bytes()  # found in the tree: not Python, not touched
    assert stub.read_text() == MIGRATED  # a stub is Python
    assert main([str(notes), "--no-progress"]) == EXIT_OK  # named directly: skipped, and said so
    assert notes.read_bytes() == LEGACY.read_bytes()
    assert f"skipped: {notes}: not a Python file (.py, .pyi)" in capsys.readouterr().err


def test_a_file_that_does_not_parse_and_names_nothing_legacy_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n    return 1\n")
    assert main([str(tmp_path), "--no-progress"]) == EXIT_OK  # nothing to migrate in it
    assert f"skipped: {broken}:1:7: does not parse: " in capsys.readouterr().err
    assert broken.read_text() == "def f(:\n    return 1\n"


def test_a_file_only_newer_pythons_parse_that_names_nothing_legacy_is_not_called_unparsable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """libcst's grammar decides, not the running Python's: under 3.10 and 3.11 this file is read by libcst."""
    newer = tmp_path / "registry.py"
    newer.write_text(
        "type Key = str | int\n\n\nclass Registry[K]:\n"
        '    def describe(self, key: K) -> str:\n        return f"{key}: {", ".join(["a", "b"])}"\n'
    )
    broken = tmp_path / "broken.py"
    broken.write_text("class Registry[K:\n    pass\n")
    assert main([str(tmp_path), "--no-progress"]) == EXIT_OK
    err = capsys.readouterr().err
    assert f"{newer}" not in err
    assert f"skipped: {broken}:1:" in err and "does not parse" in err


def test_an_empty_folder_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "README.md").write_text("# nothing here\n")
    assert main([str(tmp_path), "--no-progress"]) == EXIT_OK
    assert f"no Python file (.py, .pyi) found under {tmp_path}: nothing to migrate" in capsys.readouterr().err


def test_failed_files_are_named_in_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(FIXTURES / "unparsable.bad.py", tmp_path / "broken.py")
    shutil.copy(LEGACY, tmp_path / "server.py")
    assert main([str(tmp_path), "--no-progress"]) == EXIT_ERROR
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == f"failed (left untouched, the error: lines above say why): {tmp_path / 'broken.py'}"


def test_a_link_inside_the_tree_is_migrated_through_its_target_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    shutil.copy(LEGACY, tree / "pkg" / "server.py")
    (tree / "alias.py").symlink_to(Path("pkg") / "server.py")
    (tree / "pkg" / "again.py").symlink_to("server.py")
    assert main([str(tree), "--no-progress"]) == EXIT_OK
    assert (tree / "alias.py").is_symlink() and (tree / "pkg" / "again.py").is_symlink()
    assert (tree / "pkg" / "server.py").read_text() == MIGRATED
    assert "files scanned: 1 " in capsys.readouterr().err  # the target, once
    # a link named on its own is migrated through its target too, and stays a link
    shutil.copy(LEGACY, tree / "pkg" / "server.py")
    assert main([str(tree / "alias.py"), "--no-progress"]) == EXIT_OK
    assert (tree / "alias.py").is_symlink()
    assert (tree / "pkg" / "server.py").read_text() == MIGRATED


def test_a_patch_through_a_link_names_the_file_it_leads_to(repository: Path) -> None:
    """git keeps a link as a link: the patch changes the file it points to, so ``git apply`` takes it."""
    server = repository / "src" / "pkg" / "server.py"
    link = repository / "current.py"
    link.symlink_to(Path("src") / "pkg" / "server.py")
    migrated = subprocess.run(
        [*MIGRATE, "--diff", "--no-progress", str(link)], cwd=CHECKOUT, capture_output=True, text=True, check=False
    )
    assert "--- a/src/pkg/server.py\n" in migrated.stdout, migrated.stdout[:300]
    applied = subprocess.run(
        ["git", "-C", str(repository), "apply"], input=migrated.stdout, capture_output=True, text=True, check=False
    )
    assert applied.returncode == 0, applied.stderr
    assert link.is_symlink() and server.read_text() == MIGRATED


def test_a_link_leaving_the_tree_is_left_and_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outside = tmp_path / "elsewhere" / "shared.py"
    outside.parent.mkdir()
    shutil.copy(LEGACY, outside)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "shared.py").symlink_to(outside)
    (tree / "dangling.py").symlink_to(tmp_path / "gone.py")
    assert main([str(tree), "--no-progress"]) == EXIT_OK
    err = capsys.readouterr().err
    assert (tree / "shared.py").is_symlink() and os.readlink(tree / "shared.py") == str(outside)
    assert outside.read_bytes() == LEGACY.read_bytes()
    assert f"skipped: {tree / 'shared.py'}: a link to {outside}, outside the tree: left as it is" in err
    assert f"skipped: {tree / 'dangling.py'}: a link to nothing: left as it is" in err


def test_an_error_line_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copy(LEGACY, tmp_path / "server.py")
    node_repr = "IndentedBlock(\n" + "    body=[],\n" * 10_000 + ")"

    def failing(*args: object, **kwargs: object) -> None:
        raise MigrationError(f"{tmp_path / 'server.py'}: rule CG101 failed: KeyError: {node_repr}")

    monkeypatch.setattr(batch_run, "migrate_bytes", failing)
    assert main([str(tmp_path), "--no-progress", "-j", "1"]) == EXIT_ERROR
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {tmp_path / 'server.py'}: rule CG101 failed: KeyError: IndentedBlock( ..."]


def test_one_line_cuts_long_messages() -> None:
    assert one_line("short") == "short"
    assert one_line("first\nsecond") == "first ..."
    cut = one_line("x" * 1000, width=50)
    assert len(cut) == 50 and cut.endswith("...")


def _legacy_tree(root: Path, files: int) -> Path:
    for index in range(files):
        folder = root / f"pkg{index % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(LEGACY, folder / f"server_{index}.py")
    return root


@pytest.mark.parametrize("jobs", [1, 2])
def test_ctrl_c_stops_the_run_and_leaves_every_file_whole(tmp_path: Path, jobs: int) -> None:
    """SIGINT to the process group, as a terminal sends it: exit 130 within a second, one line, no traceback."""
    tree = _legacy_tree(tmp_path / "tree", 400)
    process = subprocess.Popen(
        [*MIGRATE, str(tree), "-j", str(jobs)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert process.stderr is not None
    first = process.stderr.readline()  # the first progress line: a tenth of the files is done
    assert first.startswith("migrating: "), first
    sent = time.perf_counter()
    os.killpg(process.pid, signal.SIGINT)
    status = process.wait(timeout=30)
    took = time.perf_counter() - sent
    rest = process.stderr.read()
    assert status == EXIT_INTERRUPTED, rest
    assert took < 1.0, f"stopped {took:.2f} s after Ctrl-C"
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest
    last = rest.strip().splitlines()[-1]
    assert last.startswith("interrupted: ") and last.endswith("of 400 left untouched"), rest
    written = int(last.split()[1])
    contents = [path.read_bytes() for path in tree.rglob("*.py")]
    assert len(contents) == 400
    migrated = sum(content == MIGRATED.encode() for content in contents)
    untouched = sum(content == LEGACY.read_bytes() for content in contents)
    assert (migrated, untouched) == (written, 400 - written)
    assert 0 < written < 400
    assert not [path for path in tree.rglob("*") if path.name.endswith(".migrate-tmp")]
