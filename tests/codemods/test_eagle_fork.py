"""The done-when proof of moving SGLang's EAGLE draft runners: an EAGLE fork (``forks/eagle_fork``) whose draft
runner subclasses are written against SGLang 0.5.13 migrates onto cudagraph's draft runners, and its own tests pass
after.

1. Its tests pass before migration, against the legacy API stand-in (``plugins/legacy_api``; ``slow``, as the
   plugins' own check before migration is).
2. ``cudagraph-migrate`` moves both subclasses onto ``DraftCudaGraphRunner`` / ``DraftExtendCudaGraphRunner`` with
   no TODO, and a second run changes nothing.
3. The one manual step the fork's ``manual_steps.toml`` states (the builder: the new runners are built from the draft
   model runner, a config and ``num_steps`` / ``query_len``, where SGLang built them from the EAGLE worker) is
   applied, and the fork's tests pass, now against cudagraph's runners on the CPU. Without that step they fail
   (``slow``): the tests do reach the new runners.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .test_plugins import LEGACY_API, copy_plugin, migrate, migrate_in_process, python_files, todo_comments

FORK = Path(__file__).parent / "forks" / "eagle_fork"
SUBCLASSES = FORK / "eagle_fork" / "draft_runners.py"
NEW_BASES = {"BoundedDraftRunner": "DraftCudaGraphRunner", "CountingDraftExtendRunner": "DraftExtendCudaGraphRunner"}

tomllib = pytest.importorskip(
    "tomllib" if sys.version_info >= (3, 11) else "tomli",
    reason="reading manual_steps.toml on Python 3.10 needs tomli: pip install tomli",
)


def run_fork_tests(fork: Path) -> subprocess.CompletedProcess[str]:
    """The fork's own tests, with the stand-in and the fork first on the path."""
    inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(LEGACY_API), str(fork), *inherited]),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull]
    command += ["--rootdir", str(fork), "--confcutdir", str(fork), "tests"]
    return subprocess.run(command, cwd=fork, env=env, capture_output=True, text=True, timeout=300)


def apply_manual_steps(fork: Path) -> list[Path]:
    """Apply ``manual_steps.toml`` to ``fork`` (each ``old`` found exactly once); the files changed."""
    changed = []
    for step in tomllib.loads((FORK / "manual_steps.toml").read_text())["step"]:
        path = fork / step["file"]
        text = path.read_text()
        assert text.count(step["old"]) == 1, f"{step['file']}: the manual step's text is not there once"
        path.write_text(text.replace(step["old"], step["new"]))
        changed.append(path)
    return changed


@dataclass(frozen=True)
class Migration:
    """The fork migrated into a copy, with the migration's report."""

    copy: Path
    report: str


@pytest.fixture(scope="module")
def migration(tmp_path_factory: pytest.TempPathFactory) -> Migration:
    copy = copy_plugin(FORK, tmp_path_factory.mktemp("migrated"))
    result = migrate(copy)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return Migration(copy, result.stdout + result.stderr)


@pytest.fixture(scope="module")
def migrated(migration: Migration) -> Path:
    return migration.copy


def imported_from(path: Path) -> dict[str, str]:
    """Local name -> the module a from-import of ``path`` takes it from."""
    return {
        alias.asname or alias.name: node.module or ""
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def bases(path: Path) -> dict[str, list[str]]:
    """Each module-level class of ``path`` with its bases as written."""
    tree = ast.parse(path.read_text())
    return {
        node.name: [ast.unparse(base) for base in node.bases] for node in tree.body if isinstance(node, ast.ClassDef)
    }


@pytest.mark.slow
def test_the_fork_tests_pass_before_migration(tmp_path: Path) -> None:
    result = run_fork_tests(copy_plugin(FORK, tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]


def test_the_fork_s_subclasses_move_onto_the_draft_runners_with_no_todo(migrated: Path) -> None:
    path = migrated / SUBCLASSES.relative_to(FORK)
    assert bases(SUBCLASSES) == {
        "BoundedDraftRunner": ["EAGLEDraftCudaGraphRunner"],
        "CountingDraftExtendRunner": ["EAGLEDraftExtendCudaGraphRunner"],
    }
    assert bases(path) == {name: [base] for name, base in NEW_BASES.items()}
    imported = imported_from(path)
    assert [imported[name] for name in NEW_BASES.values()] == ["cudagraph.runner", "cudagraph.runner"]
    assert imported["freeze_gc"] == "cudagraph.backend_utils"
    assert not [module for module in imported.values() if module.startswith("sglang")]
    assert list(todo_comments(migrated)) == []


def test_the_report_says_where_to_look_for_the_manual_step(migration: Migration) -> None:
    # The builder calls the fork's own classes, out of the migration's sight: the report points at each class moved.
    review = [line for line in migration.report.splitlines() if line.startswith("review:")]
    for name, base in NEW_BASES.items():
        assert any(
            f"{name} now derives from {base}" in line and f"check where {name} is built" in line for line in review
        )


def test_a_second_run_changes_nothing(migrated: Path, tmp_path: Path) -> None:
    again = copy_plugin(migrated, tmp_path)
    assert migrate_in_process(again) == 0
    assert python_files(again) == python_files(migrated)


def test_the_fork_tests_pass_after_migration_and_its_one_manual_step(migrated: Path, tmp_path: Path) -> None:
    fork = copy_plugin(migrated, tmp_path)
    changed = apply_manual_steps(fork)
    assert [path.relative_to(fork).as_posix() for path in changed] == ["eagle_fork/build.py"]
    result = run_fork_tests(fork)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]


@pytest.mark.slow
def test_without_the_manual_step_the_migrated_fork_fails_on_the_new_constructor(migrated: Path, tmp_path: Path) -> None:
    result = run_fork_tests(copy_plugin(migrated, tmp_path))
    assert result.returncode != 0
    assert "missing 1 required positional argument: 'config'" in result.stdout, result.stdout[-3000:]
