"""``python -m cudagraph.migrate.example``: migrate the bundled legacy example engine and run its tests.

1. Copies the example (``codemods/examples/legacy_engine`` in a checkout, packaged data in a wheel) to
   ``./cudagraph-migrate-example/legacy_engine`` under the current directory (``--workdir`` picks another folder;
   a previous result there is replaced, with a line saying so).
2. Migrates the copy in place, as ``cudagraph-migrate`` would, and prints the patch, every finding
   (``todo: PATH:LINE: ...`` for a place that needs a manual step) and the summary.
3. Writes the patch beside the copy (``cudagraph-migrate-example/migration.patch``): ``git apply -p1
   migration.patch`` inside a pristine copy of the example reproduces the migrated one.
4. Runs the example's own tests with pytest, in a subprocess, against the migrated copy.

Both paths are printed, and both stay for the user to read. The exit status is pytest's (or 1 when migration itself
failed). The tests need pytest and ``cudagraph-legacy`` (with torch); where either is not installed (a plain
``pip install cudagraph-migrate``), the tests are not run, one line says what to install, and the exit status is 0.
The example's argument lists are its own engine's command line (parsed with ``cudagraph.config.add_cli_args``), so
it is migrated as such an engine's owner would: with ``--rewrite-argv``. It never writes outside the chosen folder.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .batch_run import MigrationOptions, RunReport, migrate_files, with_project_reexports
from .command import EXIT_ERROR, format_finding, format_item, format_summary
from .files import discover
from .options import RunOptions
from .rules import RULES
from .rules.base import FindingKind

__all__ = ["DEFAULT_WORKDIR", "PATCH_NAME", "ExampleMigration", "example_source", "main", "migrate_example"]

DEFAULT_WORKDIR = "cudagraph-migrate-example"
"""Where the result goes by default, under the current directory (git-ignored in this repository)."""
PATCH_NAME = "migration.patch"
"""The patch written beside the migrated copy."""
COPY_NAME = "legacy_engine"
"""The migrated copy's folder, inside the work folder."""
_PACKAGED_EXAMPLE = Path(__file__).parent / "data" / "examples" / "legacy_engine"
_CHECKOUT_EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "legacy_engine"


def example_source() -> Path:
    """Where the bundled example lives in this installation (wheel data first, then the source checkout)."""
    for candidate in (_PACKAGED_EXAMPLE, _CHECKOUT_EXAMPLE):
        if (candidate / "toy_engine").is_dir():
            return candidate
    raise FileNotFoundError(
        f"the legacy example engine is missing: looked in {_PACKAGED_EXAMPLE} and {_CHECKOUT_EXAMPLE}"
    )


@dataclass(frozen=True)
class ExampleMigration:
    """Where one migration of the example left its result, and what it did."""

    copy: Path
    """The migrated copy of the example."""
    patch: Path
    """The ``git apply -p1``-able patch from the pristine example to :attr:`copy`."""
    report: RunReport
    """Per file: status, edits and findings."""
    replaced: bool
    """Whether a previous result was replaced."""


def migrate_example(destination: Path) -> ExampleMigration:
    """Copy the example to ``destination/legacy_engine``, migrate it in place, write the patch to
    ``destination/migration.patch``, and print the patch, the findings, the summary and both paths to stdout."""
    target = destination / COPY_NAME
    replaced = target.exists()
    if replaced:
        print(f"replacing the previous result in {_shown(target)}")
        shutil.rmtree(target)
    shutil.copytree(example_source(), target, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    options = MigrationOptions(
        rule_codes=tuple(rule.code for rule in RULES),
        write=True,
        diff=True,
        run=RunOptions(rewrite_argv=True),
        patch_root=str(target),  # the patch names files as the example's root sees them: a/toy_engine/...
    )
    files = discover([_shown(target)]).files
    report = migrate_files(files, with_project_reexports(options, files, [Path(_shown(target))]))
    patch = "".join(file_report.diff or "" for file_report in report.files)
    patch_path = destination / PATCH_NAME
    patch_path.write_text(patch, encoding="utf-8")
    sys.stdout.write(patch)
    for file_report in report.files:
        if file_report.error:
            print(f"error: {file_report.error}")
        for finding in file_report.findings:
            if finding.kind is not FindingKind.SKIP:
                print(format_finding(file_report.path, finding))
        for accounted in file_report.inventory:
            if accounted.left and not accounted.reported:
                print(format_item(file_report.path, accounted))
    print(format_summary(report, written=True))
    print(f"migrated copy: {_shown(target)}")
    print(f"patch: {_shown(patch_path)} (git apply -p1 {PATCH_NAME} inside a pristine copy reproduces the migration)")
    sys.stdout.flush()
    return ExampleMigration(target, patch_path, report, replaced)


def _shown(path: Path) -> str:
    """``path`` relative to the current directory when inside it (shorter to read), else as given."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def main(argv: Sequence[str] | None = None) -> int:
    """Migrate the example into the work folder (kept for the user to read) and run its tests there."""
    parser = argparse.ArgumentParser(
        prog="python -m cudagraph.migrate.example",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(DEFAULT_WORKDIR),
        help=f"folder for the migrated copy and its patch (default: ./{DEFAULT_WORKDIR}; replaces a previous result)",
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    return _migrate_and_test(args.workdir.resolve(), args.pytest_args)


_TEST_NEEDS = (("pytest", "pytest"), ("cudagraph.legacy", "cudagraph-legacy"), ("torch", "torch"))
"""What the example's tests import, as (module, the distribution that brings it)."""


def missing_for_tests() -> list[str]:
    """The distributions the example's tests need that this environment lacks."""
    return [distribution for module, distribution in _TEST_NEEDS if not _importable(module)]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _migrate_and_test(workdir: Path, pytest_args: Sequence[str]) -> int:
    result = migrate_example(workdir)
    if result.report.count("failed"):
        return EXIT_ERROR
    missing = missing_for_tests()
    if missing:
        print(
            f"the example's tests were not run: they need {', '.join(missing)}, not installed here "
            f"(pip install {' '.join(missing)})",
            flush=True,
        )
        return 0
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *pytest_args]
    print(f"$ (cd {_shown(result.copy)} && {shlex.join(command)})", flush=True)
    return subprocess.run(command, cwd=result.copy, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
