"""The legacy example engine runs unmigrated through the shims, and after migration with no shim and no warning."""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cudagraph.migrate.example import example_source, migrate_example

# Loaded into the example's pytest run: fails the run if any legacy shim module was imported.
NO_LEGACY_PLUGIN = """
import sys


def pytest_sessionfinish(session, exitstatus):
    legacy = sorted(name for name in sys.modules if name.startswith("cudagraph.legacy"))
    if legacy:
        raise RuntimeError(f"legacy shim modules were imported: {legacy}")
"""


def _pytest(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *args]
    return subprocess.run(command, cwd=directory, capture_output=True, text=True, check=False)


@pytest.fixture
def unmigrated(tmp_path: Path) -> Path:
    target = tmp_path / "legacy_engine"
    shutil.copytree(example_source(), target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


@pytest.fixture
def migrated(tmp_path: Path) -> Path:
    with contextlib.redirect_stdout(io.StringIO()):
        migration = migrate_example(tmp_path)
    assert migration.report.count("failed") == 0
    target = migration.copy
    (target / "no_legacy_plugin.py").write_text(NO_LEGACY_PLUGIN)
    return target


@pytest.mark.slow  # deep: the example's whole suite through the shims; the plugin test below imports one
def test_unmigrated_example_passes_through_the_shims_with_warnings(unmigrated: Path) -> None:
    result = _pytest(unmigrated, "-W", "always::DeprecationWarning")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "cudagraph.legacy.cuda_graph_runner.CudaGraphRunner is deprecated" in result.stdout
    assert "DeprecationWarning" in result.stdout


def test_the_no_legacy_plugin_catches_an_imported_shim(unmigrated: Path) -> None:
    (unmigrated / "no_legacy_plugin.py").write_text(NO_LEGACY_PLUGIN)
    result = _pytest(unmigrated, "-p", "no_legacy_plugin")
    assert result.returncode != 0
    assert "legacy shim modules were imported" in result.stdout + result.stderr


@pytest.mark.slow  # deep: the example's whole suite again, deprecations as errors
def test_unmigrated_example_fails_at_the_first_legacy_use_under_error(unmigrated: Path) -> None:
    result = _pytest(unmigrated, "-W", "error::DeprecationWarning")
    assert result.returncode != 0
    assert "DeprecationWarning: cudagraph.legacy." in result.stdout


def test_migrated_example_passes_with_no_shim_and_deprecations_as_errors(migrated: Path) -> None:
    # The platform runner plugin needs a manual step (its TODOs say so) and keeps its legacy base; everything else
    # must run with no shim at all.
    sources = [path for path in migrated.rglob("*.py") if path.name != "no_legacy_plugin.py"]
    manual = {path for path in sources if "# TODO(cudagraph-migrate):" in path.read_text()}
    assert {path.name for path in manual} == {"platform_runner.py"}
    assert not [path for path in sources if path not in manual and "cudagraph.legacy" in path.read_text()]
    result = _pytest(
        migrated,
        "-W",
        "error::DeprecationWarning",
        "-W",
        "error::FutureWarning",
        "-p",
        "no_legacy_plugin",
        "--ignore",
        "tests/test_platform_runner.py",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout
