"""``python -m cudagraph.migrate.example``: migrate the bundled legacy example engine and run its tests.

Copies the example (``codemods/examples/legacy_engine`` in a checkout, packaged data in a wheel) to a scratch
directory, migrates it in place, prints the diff and the summary, then runs the example's own tests with pytest in a
subprocess against the migrated copy. The exit status is pytest's (or 1 when migration itself failed). The example's
argument lists are its own engine's command line (parsed with ``cudagraph.config.add_cli_args``), so it is migrated
as such an engine's owner would: with ``--rewrite-argv``.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .cli import EXIT_ERROR, format_summary
from .files import discover
from .options import RunOptions
from .rules import RULES
from .rules.base import FindingKind
from .runner import MigrationOptions, migrate_files, with_project_reexports

__all__ = ["example_source", "main", "migrate_example"]

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


def migrate_example(destination: Path) -> tuple[Path, int]:
    """Copy the example to ``destination/legacy_engine``, migrate it, print diff and summary; (path, failed files)."""
    target = destination / "legacy_engine"
    shutil.copytree(example_source(), target, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    options = MigrationOptions(
        rule_codes=tuple(rule.code for rule in RULES), write=True, diff=True, run=RunOptions(rewrite_argv=True)
    )
    files = discover([target]).files
    report = migrate_files(files, with_project_reexports(options, files, [target]))
    for file_report in report.files:
        if file_report.diff:
            sys.stdout.write(file_report.diff.replace(str(target) + "/", ""))
        if file_report.error:
            print(f"error: {file_report.error}", file=sys.stderr)
        for finding in file_report.findings:
            if finding.kind is not FindingKind.SKIP:
                print(f"{finding.kind.value}: {file_report.path}: {finding}", file=sys.stderr)
    print(format_summary(report, written=True))
    sys.stdout.flush()
    return target, report.count("failed")


def main(argv: Sequence[str] | None = None) -> int:
    """Migrate the example into a scratch directory and run its tests there."""
    parser = argparse.ArgumentParser(prog="python -m cudagraph.migrate.example", description=__doc__)
    parser.add_argument("--workdir", type=Path, help="scratch directory to use (kept); default: a temporary one")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        return _migrate_and_test(args.workdir, args.pytest_args)
    with tempfile.TemporaryDirectory(prefix="cudagraph-migrate-example-") as scratch:
        return _migrate_and_test(Path(scratch), args.pytest_args)


def _migrate_and_test(workdir: Path, pytest_args: Sequence[str]) -> int:
    target, failed = migrate_example(workdir)
    if failed:
        return EXIT_ERROR
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *pytest_args]
    print(f"$ (cd {target} && {shlex.join(command)})", flush=True)
    return subprocess.run(command, cwd=target, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
