"""``cudagraph-migrate PATH...``: rewrite legacy CUDA-graph names in place, or show (``--diff``) / check (``--check``).

Exit status: 0 done (or nothing to change), 1 ``--check`` found files that would change, 2 errors (a file that does not
parse or cannot be written, a missing path, a bad option). Diffs go to stdout; progress, notes and the summary go to
stderr, so ``--diff`` output can be piped straight into ``git apply``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from typing import TextIO

from tqdm import tqdm

from . import __version__
from .files import discover
from .renames import RenameTableError, load_renames
from .rules import RULES, RuleSelectionError, select_rules
from .runner import FileReport, MigrationOptions, RunReport, migrate_files

__all__ = ["EXIT_CHANGES", "EXIT_ERROR", "EXIT_OK", "build_parser", "format_summary", "main"]

EXIT_OK = 0
"""Everything migrated, or nothing to migrate."""
EXIT_CHANGES = 1
"""``--check``: at least one file would change."""
EXIT_ERROR = 2
"""A file failed, a path is missing, or an option is wrong."""


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        prog="cudagraph-migrate",
        description="Rewrite code from the legacy CUDA-graph names to the cudagraph packages (refactor/renames.toml).",
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="files or directories to migrate (*.py found under)")
    parser.add_argument("--diff", action="store_true", help="print a unified diff and write nothing")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if any file would change")
    parser.add_argument("--select", action="append", default=[], metavar="CODES", help="only these rules (CG101,CG2)")
    parser.add_argument("--ignore", action="append", default=[], metavar="CODES", help="skip these rules")
    parser.add_argument("--list-rules", action="store_true", help="list the rules and exit")
    parser.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="skip matching paths")
    parser.add_argument("-j", "--jobs", type=int, default=1, metavar="N", help="worker processes (0: one per CPU)")
    parser.add_argument("--renames", metavar="TOML", help="a rename table other than the installed one")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list_rules:
        _list_rules(sys.stdout)
        return EXIT_OK
    if not args.paths:
        parser.print_usage(sys.stderr)
        print("cudagraph-migrate: error: give at least one PATH (or --list-rules)", file=sys.stderr)
        return EXIT_ERROR
    if args.jobs < 0:
        print(f"cudagraph-migrate: error: -j {args.jobs}: give a count >= 1, or 0 for one per CPU", file=sys.stderr)
        return EXIT_ERROR
    try:
        load_renames(args.renames)
        rules = select_rules(_split(args.select), _split(args.ignore))
    except (RenameTableError, RuleSelectionError) as error:
        print(f"cudagraph-migrate: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    discovery = discover(args.paths, args.exclude)
    for missing in discovery.missing:
        print(f"cudagraph-migrate: error: {missing}: no such file or directory", file=sys.stderr)
    options = MigrationOptions(
        rule_codes=tuple(rule.code for rule in rules),
        write=not (args.diff or args.check),
        diff=args.diff,
        table_path=args.renames,
    )
    jobs = args.jobs or os.cpu_count() or 1
    progress = None if args.no_progress else _progress_bar
    report = migrate_files(discovery.files, options, jobs=jobs, progress=progress)
    _print_details(report, show_diff=args.diff)
    print(format_summary(report, written=options.write), file=sys.stderr)
    if discovery.missing or report.count("failed"):
        return EXIT_ERROR
    if args.check and report.count("changed"):
        return EXIT_CHANGES
    return EXIT_OK


def format_summary(report: RunReport, *, written: bool) -> str:
    """The summary table: files scanned/changed/unchanged/failed, then edits and files per rule."""
    changed = "changed" if written else "would change"
    lines = [
        f"files scanned: {len(report.files)}   {changed}: {report.count('changed')}   "
        f"unchanged: {report.count('unchanged')}   failed: {report.count('failed')}",
        f"{'rule':<6} {'name':<24} {'edits':>6} {'files':>6}",
    ]
    for rule in report.rules:
        edits, files = report.edits_per_rule()[rule.code]
        lines.append(f"{rule.code:<6} {rule.name:<24} {edits:>6} {files:>6}")
    return "\n".join(lines)


def _print_details(report: RunReport, *, show_diff: bool) -> None:
    for file_report in report.files:
        if show_diff and file_report.diff:
            sys.stdout.write(file_report.diff)
        if file_report.error:
            print(f"error: {file_report.error}", file=sys.stderr)
        for note in file_report.notes:
            print(f"note: {file_report.path}: {note}", file=sys.stderr)
    sys.stdout.flush()


def _list_rules(stream: TextIO) -> None:
    table = load_renames()
    for rule in RULES:
        rows = len(table.of_kind(*rule.kinds))
        kinds = "/".join(kind.value for kind in rule.kinds)
        print(f"{rule.code}  {rule.name:<24} {rule.summary} [{rows} {kinds} rows]", file=stream)


def _split(entries: Sequence[str]) -> list[str]:
    return [part for entry in entries for part in entry.split(",") if part.strip()]


def _progress_bar(reports: Iterator[FileReport], total: int) -> Iterator[FileReport]:
    yield from tqdm(reports, total=total, file=sys.stderr, unit="file", desc="migrating", disable=None, leave=False)


if __name__ == "__main__":
    sys.exit(main())
