"""``python -m cudagraph.migrate.example``: migrate the bundled legacy example engine and run its tests.

Copies the example (``codemods/examples/legacy_engine`` in a checkout, packaged data in a wheel) to
``./cudagraph-migrate-example/legacy_engine`` (``--workdir`` picks another folder; a previous result there is
replaced), migrates it in place, prints the diff and the summary, writes the patch beside it
(``cudagraph-migrate-example/migration.patch``: ``git apply -p1`` inside a pristine copy reproduces the migration), then
runs the example's own tests with pytest in a subprocess against the migrated copy. Both paths are printed.

The exit status is pytest's (or 1 when migration itself failed). The example's
argument lists are its own engine's command line (parsed with ``cudagraph.config.add_cli_args``), so it is migrated
as such an engine's owner would: with ``--rewrite-argv``.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from .cli import EXIT_ERROR, format_summary
from .files import discover
from .options import RunOptions
from .rules import RULES
from .rules.base import FindingKind
from .runner import MigrationOptions, migrate_files, with_project_reexports

__all__ = ["example_source", "main", "migrate_example"]

DEFAULT_WORKDIR = "cudagraph-migrate-example"
"""Where the result goes by default, under the current directory (git-ignored in this repository)."""
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


PATCH_NAME = "migration.patch"
"""The patch written beside the migrated copy."""


def migrate_example(destination: Path) -> tuple[Path, int]:
    """Copy the example to ``destination/legacy_engine``, migrate it, print diff and summary, write the patch to
    ``destination/migration.patch``; (path of the migrated copy, failed files)."""
    target = destination / "legacy_engine"
    if target.exists():
        print(f"replacing the previous result in {target}", file=sys.stderr)
        shutil.rmtree(target)
    shutil.copytree(example_source(), target, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    options = MigrationOptions(
        rule_codes=tuple(rule.code for rule in RULES),
        write=True,
        diff=True,
        run=RunOptions(rewrite_argv=True),
        patch_root=str(target),
    )
    files = discover([target]).files
    report = migrate_files(files, with_project_reexports(options, files, [target]))
    patch = "".join(file_report.diff or "" for file_report in report.files)
    sys.stdout.write(patch)
    (destination / PATCH_NAME).write_text(patch, encoding="utf-8")
    for file_report in report.files:
        if file_report.error:
            print(f"error: {file_report.error}", file=sys.stderr)
        for finding in file_report.findings:
            if finding.kind is not FindingKind.SKIP:
                print(f"{finding.kind.value}: {file_report.path}: {finding}", file=sys.stderr)
    print(format_summary(report, written=True))
    print(f"migrated copy: {target}\npatch: {destination / PATCH_NAME} (git apply -p1 inside a pristine copy)")
    sys.stdout.flush()
    return target, report.count("failed")


def main(argv: Sequence[str] | None = None) -> int:
    """Migrate the example into a scratch directory and run its tests there."""
    parser = argparse.ArgumentParser(prog="python -m cudagraph.migrate.example", description=__doc__)
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


def _migrate_and_test(workdir: Path, pytest_args: Sequence[str]) -> int:
    target, failed = migrate_example(workdir)
    if failed:
        return EXIT_ERROR
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *pytest_args]
    print(f"$ (cd {target} && {shlex.join(command)})", flush=True)
    return subprocess.run(command, cwd=target, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
