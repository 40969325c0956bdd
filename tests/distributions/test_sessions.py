"""What ``nox -s tests`` leaves out is run by another session that CI runs: the tests marked ``slow`` are not in the
README's command (``FAST_SELECTION``), ``nox -s slow`` runs exactly those (``SLOW_SELECTION``), and ``.ci/run`` runs
``nox -s slow``, as the GitHub workflow's tests job does. The noxfile is read with :mod:`ast` (this module imports
neither nox nor torch)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from .workspace import ROOT, load_distributions

NOXFILE = ast.parse((ROOT / "noxfile.py").read_text())


def noxfile_constant(name: str) -> tuple[str, ...]:
    """A module-level tuple of the noxfile, by name."""
    return next(
        ast.literal_eval(node.value)
        for node in NOXFILE.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name
    )


def marker_expression(selection: tuple[str, ...]) -> str:
    """The ``-m`` expression of a pytest selection."""
    return selection[selection.index("-m") + 1]


def session_names_used(session: str) -> set[str]:
    """The names a session function of the noxfile reads."""
    function = next(node for node in NOXFILE.body if isinstance(node, ast.FunctionDef) and node.name == session)
    return {node.id for node in ast.walk(function) if isinstance(node, ast.Name)}


# One test of each kind of marking: what each selection collects is read from pytest itself.
MARKED_MODULE = """
import pytest

def test_plain(): pass

@pytest.mark.slow
def test_slow(): pass

@pytest.mark.parametrize("n", [1, pytest.param(4, marks=pytest.mark.slow)])
def test_sizes(n): pass

@pytest.mark.realtrees
def test_trees(): pass

@pytest.mark.slow
@pytest.mark.realtrees
def test_slow_trees(): pass

@pytest.mark.gpu
def test_gpu(): pass
"""


def collected(tmp_path: Path, expression: str) -> set[str]:
    """The ids pytest collects from ``MARKED_MODULE`` under ``-m expression``."""
    (tmp_path / "test_marked.py").write_text(MARKED_MODULE)
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-c", os.devnull]
    command += ["--rootdir", str(tmp_path), "-m", expression, "test_marked.py"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode in (0, 5), result.stdout + result.stderr  # 5: nothing collected
    return {line.split("::", 1)[1] for line in result.stdout.splitlines() if line.startswith("test_marked.py::")}


def test_the_readme_command_leaves_out_every_test_marked_slow(tmp_path: Path) -> None:
    fast = collected(tmp_path, marker_expression(noxfile_constant("FAST_SELECTION")))
    assert fast == {"test_plain", "test_sizes[1]", "test_gpu"}


def test_the_slow_session_runs_exactly_what_the_readme_command_leaves_to_it(tmp_path: Path) -> None:
    slow = collected(tmp_path, marker_expression(noxfile_constant("SLOW_SELECTION")))
    assert slow == {"test_slow", "test_sizes[4]"}  # the real trees are `realtrees`'s


@pytest.mark.parametrize(("session", "selection"), [("tests", "FAST_SELECTION"), ("slow", "SLOW_SELECTION")])
def test_each_session_runs_its_selection(session: str, selection: str) -> None:
    assert selection in session_names_used(session)


def test_ci_runs_the_slow_session_beside_the_readme_command() -> None:
    # a line of its own at the top level of the script (not inside a loop or a function, not commented out)
    top_level = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines() if not line[:1].isspace()]
    assert "nox -s slow" in top_level, "`.ci/run` must run `nox -s slow` (the tests marked slow)"


def test_the_github_tests_job_runs_the_slow_session_too() -> None:
    workflow = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    runs = [line.strip() for line in workflow.splitlines() if line.strip().startswith("- run: nox -s ")]
    assert '- run: nox -s slow --force-python "${{ matrix.python }}"' in runs


@pytest.mark.parametrize("name", sorted(load_distributions()))
def test_the_venv_holds_what_each_distribution_builds_with(name: str) -> None:
    """The torch sessions build the workspace without build isolation, against ``BUILD_REQUIREMENTS``: each
    distribution's ``[build-system] requires`` must be among them, at a range that admits the installed one."""
    installed = {Requirement(text).name: Requirement(text) for text in noxfile_constant("BUILD_REQUIREMENTS")}
    for text in load_distributions()[name].pyproject["build-system"]["requires"]:
        needed = Requirement(text)
        assert needed.name in installed, f"{name} builds with {needed}, which BUILD_REQUIREMENTS lacks"
        assert installed[needed.name].specifier == needed.specifier, (installed[needed.name], needed)
