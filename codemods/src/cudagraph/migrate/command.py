"""``cudagraph-migrate PATH...``: rewrite legacy CUDA-graph names in place, or show (``--diff``) / check (``--check``).

Conventions follow ruff and black. Exit status:

- 0: done, or nothing to change;
- 1: ``--check``/``--diff``/``--patch`` found files that would change (migratable code remains); or ``--strict``
  (on a writing run as with ``--check``) found places that need a manual step, each marked in its file with a
  ``# TODO(cudagraph-migrate)`` comment; or a file failed (it does not parse, cannot be written, or its migration
  would not import: such a file is left untouched);
- 2: a usage error (a bad option, a missing path): nothing was done;
- 130: Ctrl-C stopped the run: each file is either as it was or fully migrated, and one line says how many were
  written.

In CI, ``cudagraph-migrate --check PATH`` fails while code the tool can migrate remains, and
``cudagraph-migrate --check --strict PATH`` also fails until every manual step is done.

The summary says what was migrated, what needs a manual step (the TODO count and the files holding them, each place
marked with its comment) and what is listed for review (legacy options of other programs, rewritten only with
``--rewrite-argv`` or ``--rewrite-engine-options``, and definitions of legacy flags, never rewritten), what is maybe
tied to the legacy API (places in files that import a legacy engine that nothing ties to it, never rewritten) and how
many same-spelled names were left alone as not tied; the per-rule table follows with ``-v`` or when a rule edited
something. Each finding is one line, ``todo: PATH:LINE: CODE message`` (``review:`` for both kinds listed for review,
and with ``-v`` ``skip:`` for every name left alone).

Patches and ``--check``'s file list go to stdout; progress, findings and the summary go to stderr, so ``--diff``
output can be piped straight into ``git apply``; ``--patch FILE`` writes the patch to FILE instead (empty when nothing
would change), for runners that mix the two streams. A patch names each file relative to the top of its git work
tree (outside a repository, relative to the PATH it was found under), so ``cudagraph-migrate --diff TREE | git -C TREE
apply`` works from anywhere. ``-`` reads one file from stdin and writes the migrated text to stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

from . import __version__
from .batch_run import (
    FileReport,
    MigrationOptions,
    RunReport,
    migrate_bytes,
    migrate_files,
    one_line,
    unified_patch,
    usable_cpus,
    with_project_reexports,
)
from .config_files import CONFIG_EXTRA_HINT, config_libraries_installed
from .files import Discovery, discover
from .guide import explain
from .inventory import AccountedItem, FileKind, Outcome, account_migration, file_kind
from .options import RunOptions
from .renames import RenameTableError, load_renames
from .rules import RULES, RuleSelectionError, select_rules
from .rules.base import Finding, FindingKind
from .source_migration import MigrationError

__all__ = [
    "EXIT_CHANGES",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "build_parser",
    "format_finding",
    "format_item",
    "format_summary",
    "main",
]

EXIT_OK = 0
"""Everything migrated, or nothing to migrate."""
EXIT_CHANGES = 1
"""``--check``/``--diff``/``--patch``: at least one file would change (migratable code remains); ``--strict``: a place
needs a manual step; or a file failed and was left untouched."""
EXIT_ERROR = EXIT_CHANGES
"""A file failed (reported, left untouched)."""
EXIT_USAGE = 2
"""A bad option or a missing path: nothing was done."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT, as shells report it): every file as it was or fully migrated."""
STDIN = "-"
_PREFIX = {
    FindingKind.TODO: "todo",
    FindingKind.ARGV: "review",
    FindingKind.MAYBE: "review",
    FindingKind.SKIP: "skip",
}
"""How each finding's line starts, in the summary's words: ``todo`` needs a manual step, ``review`` is listed for
review (another program's option, or a place maybe tied to a legacy engine), ``skip`` was left alone as not legacy."""

_EXIT_STATUS_HELP = """\
exit status:
  0  done, or nothing to change
  1  --check/--diff/--patch: a file would change (migratable code remains);
     --strict: a place needs a manual step (a # TODO(cudagraph-migrate) comment marks it);
     or a file failed and was left untouched
  2  usage error (a bad option, a missing path)
  130  interrupted (Ctrl-C): every file is as it was or fully migrated

CI: `cudagraph-migrate --check PATH` fails while migratable code remains;
`cudagraph-migrate --check --strict PATH` also fails until every manual step is done."""


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        prog="cudagraph-migrate",
        description="Rewrite code from the legacy CUDA-graph names to the cudagraph packages (refactor/renames.toml).",
        epilog=_EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="files or directories to migrate; - reads stdin")
    parser.add_argument("--diff", action="store_true", help="print a git-apply-able patch, write nothing")
    parser.add_argument(
        "--patch",
        type=Path,
        metavar="FILE",
        help="write a git-apply-able patch to FILE (empty when nothing would change), write no source",
    )
    parser.add_argument("--check", action="store_true", help="list files that would change, write nothing")
    parser.add_argument(
        "--strict",
        action="store_true",
        help="also exit 1 while manual steps remain (places marked # TODO(cudagraph-migrate)), with --check or on a "
        "writing run: for CI",
    )
    parser.add_argument("--select", action="append", default=[], metavar="CODES", help="only these rules (CG101,CG2)")
    parser.add_argument("--ignore", action="append", default=[], metavar="CODES", help="skip these rules")
    parser.add_argument("--list-rules", action="store_true", help="list the rules and exit")
    parser.add_argument(
        "--explain",
        metavar="CODE",
        help="print how to do by hand what rule CODE leaves (the steps its TODO comments name) and exit",
    )
    parser.add_argument("--exclude", action="append", default=[], metavar="PATTERN", help="gitignore-style pattern")
    parser.add_argument("--no-gitignore", action="store_true", help="also migrate files .gitignore excludes")
    parser.add_argument(
        "--rewrite-argv",
        action="store_true",
        help="also rewrite legacy flags in argv lists and command strings (other programs' command lines: "
        "only when those programs use cudagraph.config's flags)",
    )
    parser.add_argument(
        "--rewrite-engine-options",
        action="store_true",
        help="also rewrite legacy options passed to or read from other engines' Python APIs (ServerArgs(...), "
        "Engine(...), server_args.<option>): only when those engines take cudagraph.config's options",
    )
    parser.add_argument(
        "--rewrite-config",
        action="store_true",
        help="also rename legacy option keys in YAML, TOML and JSON files in place, keeping comments and order "
        "(YAML and TOML need the extra: pip install 'cudagraph-migrate[config]')",
    )
    parser.add_argument(
        "--move-shared-state",
        action="store_true",
        help="also move the capture flag, graph pool and forward context helpers off a legacy engine's modules: only "
        "once that engine's graph runners are cudagraph's (they share that state with the code that reads it)",
    )
    cpus = usable_cpus()
    parser.add_argument("-j", "--jobs", type=int, default=cpus, metavar="N", help=f"worker processes (default {cpus})")
    parser.add_argument("--renames", metavar="TOML", help="a rename table other than the installed one")
    parser.add_argument("--no-progress", action="store_true", help="no progress display")
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument("-q", "--quiet", action="store_true", help="print errors only")
    verbosity.add_argument("-v", "--verbose", action="store_true", help="also list names left alone as not legacy")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    try:
        return _main(argv)
    except KeyboardInterrupt:  # before or after the files' migration: nothing was written
        print("interrupted: no file written", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list_rules:
        _list_rules(sys.stdout)
        return EXIT_OK
    if args.explain is not None:
        try:
            sys.stdout.write(explain(args.explain))
        except KeyError as error:
            print(f"cudagraph-migrate: error: --explain: {error.args[0]}", file=sys.stderr)
            return EXIT_USAGE
        return EXIT_OK
    problem = _usage_problem(args)
    if problem:
        parser.print_usage(sys.stderr)
        print(f"cudagraph-migrate: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        load_renames(args.renames)
        rules = select_rules(_split(args.select), _split(args.ignore))
    except (RenameTableError, RuleSelectionError) as error:
        print(f"cudagraph-migrate: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    options = MigrationOptions(
        rule_codes=tuple(rule.code for rule in rules),
        write=not (args.diff or args.check or args.patch),
        diff=args.diff or args.patch is not None,
        table_path=args.renames,
        rewrite_config=args.rewrite_config,
        run=RunOptions(
            rewrite_argv=args.rewrite_argv,
            rewrite_engine_options=args.rewrite_engine_options,
            move_shared_state=args.move_shared_state,
        ),
    )
    if args.paths == [STDIN]:
        return _migrate_stdin(options, args)
    discovery = discover(
        args.paths, args.exclude, use_gitignore=not args.no_gitignore, wanted=lambda name: file_kind(name) is not None
    )
    if discovery.missing:
        for missing in discovery.missing:
            print(f"cudagraph-migrate: error: {missing}: no such file or directory", file=sys.stderr)
        return EXIT_USAGE
    started = time.perf_counter()
    roots = [Path(path) for path in args.paths if Path(path).is_dir()] or [Path.cwd()]
    options = dataclasses.replace(options, patch_bases=tuple(args.paths))
    options = with_project_reexports(options, discovery.files, roots)
    progress = None if args.no_progress or args.quiet else _progress
    report = migrate_files(discovery.files, options, jobs=args.jobs, progress=progress)
    if report.interrupted:
        print(_interrupted_line(report, len(discovery.files), written=options.write), file=sys.stderr)
        return EXIT_INTERRUPTED
    _print_details(report, args)
    if (
        args.rewrite_config
        and not config_libraries_installed()
        and any(
            file_kind(file.path) in (FileKind.YAML, FileKind.TOML) and file.inventory for file in report.other_files
        )
    ):
        print(f"note: {CONFIG_EXTRA_HINT}", file=sys.stderr)
    if args.patch is not None:
        diffs = [file.diff for file in [*report.files, *report.other_files] if file.diff]
        _write_patch(args.patch, diffs, args.quiet)
    if not args.quiet:
        summary = format_summary(
            report, written=options.write, seconds=time.perf_counter() - started, verbose=args.verbose
        )
        print(summary, file=sys.stderr)
        for line in _left_as_they_are(report, discovery, args.paths):
            print(line, file=sys.stderr)
    if report.count("failed"):
        return EXIT_ERROR
    config_changed = any(file.status == "changed" for file in report.other_files)  # --rewrite-config
    if (args.check or args.diff or args.patch) and (report.count("changed") or config_changed):
        return EXIT_CHANGES
    if args.strict and (report.findings(FindingKind.TODO) or report.accounting().left):
        return EXIT_CHANGES
    return EXIT_OK


def _interrupted_line(report: RunReport, total: int, *, written: bool) -> str:
    """The one line a Ctrl-C'd run ends with: what was written, and that the rest is untouched."""
    changed = report.count("changed") if written else 0
    return (
        f"interrupted: {changed} file(s) written (each fully migrated), the other {total - changed} of {total} "
        "left untouched"
    )


def _left_as_they_are(report: RunReport, discovery: Discovery, paths: Sequence[str]) -> Iterator[str]:
    """The summary's last lines: every file skipped, failed or worth a word though left as it was, by name."""
    if not discovery.files and not discovery.skipped:
        shown = ", ".join(paths)
        yield f"no Python file (.py, .pyi) found under {shown}: nothing to migrate"
    for skipped in discovery.skipped:
        yield f"skipped: {skipped.path}: {skipped.reason}"
    for file_report in report.files:
        if file_report.warning:
            yield f"skipped: {file_report.warning}"
    failed = [file_report.path for file_report in report.files if file_report.status == "failed"]
    if failed:
        yield f"failed (left untouched, the error: lines above say why): {', '.join(failed)}"


def _usage_problem(args: argparse.Namespace) -> str | None:
    if args.diff and args.check:
        return "--diff and --check cannot be combined: --diff prints the patch, --check lists the files"
    if not args.paths:
        return "give at least one PATH (or - for stdin, or --list-rules)"
    if STDIN in args.paths and len(args.paths) > 1:
        return "- (stdin) cannot be combined with other paths"
    if args.jobs < 1:
        return f"-j {args.jobs}: give a count of at least 1"
    if args.patch is not None and not args.patch.parent.is_dir():
        return f"--patch {args.patch}: the folder {args.patch.parent} does not exist"
    return None


def _write_patch(path: Path, diffs: Sequence[str], quiet: bool) -> None:
    path.write_text("".join(diffs))
    if not quiet:
        print(f"patch: {path} ({len(diffs)} file(s); git apply {path})", file=sys.stderr)


def _migrate_stdin(options: MigrationOptions, args: argparse.Namespace) -> int:
    source = sys.stdin.buffer.read()
    try:
        result = migrate_bytes(source, "<stdin>", options)
    except MigrationError as error:
        print(f"error: {one_line(str(error))}", file=sys.stderr)
        sys.stdout.buffer.write(source)
        return EXIT_ERROR
    inventory = account_migration(source, result.migrated, result.findings, options.table_path)
    if not args.quiet:
        for finding in result.findings:
            if finding.kind is not FindingKind.SKIP or args.verbose:
                print(format_finding("<stdin>", finding), file=sys.stderr)
        for accounted in inventory:
            if accounted.outcome is not Outcome.REWRITTEN and not accounted.reported:
                print(format_item("<stdin>", accounted), file=sys.stderr)
    left = any(accounted.left for accounted in inventory)
    manual = args.strict and (left or any(finding.kind is FindingKind.TODO for finding in result.findings))
    if args.check or args.diff or args.patch:
        patch = unified_patch("<stdin>", result.original, result.migrated) if result.changed else ""
        if args.diff:
            sys.stdout.write(patch)
        if args.patch is not None:
            _write_patch(args.patch, [patch] if patch else [], args.quiet)
        return EXIT_CHANGES if result.changed or manual else EXIT_OK
    sys.stdout.buffer.write(result.migrated)
    return EXIT_CHANGES if manual else EXIT_OK


def format_summary(
    report: RunReport, *, written: bool, seconds: float | None = None, verbose: bool = False, max_files: int = 10
) -> str:
    """The summary a user acts on: what was migrated, what needs a manual step, what is listed for review.

    The files that need a manual step are listed with their TODO counts, cut after ``max_files`` (the per-finding
    lines printed before the summary name every place). The per-rule table, every rule a row as in ruff's
    statistics, follows only with ``verbose`` or when some rule edited something.
    """
    changed = "changed" if written else "would change"
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    per_rule = report.edits_per_rule()
    edits = sum(rule_edits for rule_edits, _ in per_rule.values())
    edited_files = sum(1 for file in report.files if file.edits)
    lines = [
        f"files scanned: {len(report.files)}   parsed: {report.parsed()}   {changed}: {report.count('changed')}   "
        f"unchanged: {report.count('unchanged')}   failed: {report.count('failed')}{took}",
        f"migrated: {edits} edit(s) in {edited_files} file(s)" + ("" if written else " (not written)"),
    ]
    if report.other_files:
        rewritten = sum(file.status == "changed" for file in report.other_files)
        lines.append(
            f"other text files scanned: {len(report.other_files)} (config files, scripts, notebooks)"
            + (f"   keys rewritten in: {rewritten}" if rewritten else "")
        )

    todo_files = [(file.path, len(todos)) for file in report.files if (todos := file.of_kind(FindingKind.TODO))]
    lines.append(
        f"needs a manual step: {report.findings(FindingKind.TODO)} TODO(s) in {len(todo_files)} file(s)"
        + (" (the todo: lines above name each place)" if todo_files else "")
    )
    lines.extend(f"  {path}: {count}" for path, count in todo_files[:max_files])
    if len(todo_files) > max_files:
        lines.append(f"  and {len(todo_files) - max_files} more (see above)")
    lines.append(
        f"listed for review: {report.findings(FindingKind.ARGV)} candidate(s) in other programs' options "
        "(--rewrite-argv, --rewrite-engine-options rewrite them; flag definitions stay)"
    )
    lines.append(
        f"maybe tied to the legacy API: {report.findings(FindingKind.MAYBE)} place(s) in files that import a legacy "
        "engine (a legacy member on a receiver of unknown type, a config field named like a legacy option, the "
        "builders of a subclass that moved onto a runner built otherwise): check each by hand"
    )
    if verbose or edits:
        lines.append(f"{'rule':<6} {'name':<24} {'edits':>6} {'files':>6}")
        for rule in report.rules:
            rule_edits, files = per_rule[rule.code]
            lines.append(f"{rule.code:<6} {rule.name:<24} {rule_edits:>6} {files:>6}")
    lines.append(f"not tied to the legacy API: {report.findings(FindingKind.SKIP)} (-v lists them)")
    accounting = report.accounting()
    lines.append(accounting.line())
    if accounting.todos or accounting.listed:
        not_tied = f", {accounting.not_tied} not tied to the legacy API (-v names them)" if accounting.not_tied else ""
        lines.append(
            f"legacy spellings left: {accounting.left} (--check --strict fails while any is){not_tied}: each is on a "
            "todo:, listed: or review: line above"
        )
    return "\n".join(lines)


def format_finding(path: str, finding: Finding) -> str:
    """One finding as ``todo: PATH:LINE: CODE message`` (``review:`` for ARGV, ``skip:`` for SKIP), the form editors
    and CI annotators jump from; a finding without a line reads ``todo: PATH: CODE message``."""
    where = f"{path}:{finding.line}" if finding.line else path
    return f"{_PREFIX[finding.kind]}: {where}: {finding.code} {finding.message}"


def format_item(path: str, accounted: AccountedItem) -> str:
    """A legacy spelling left in place, as ``todo: PATH:LINE:COL: SPELLING -> NEW: why`` (``listed:`` for one listed
    in the report only): its line and column in the file as it is on disk after the run (as read, where nothing
    was written)."""
    item = accounted.item
    prefix = "todo" if accounted.outcome is Outcome.TODO else "listed"
    return (
        f"{prefix}: {path}:{item.line}:{item.column}: {item.spelling.text} -> {item.spelling.new} "
        f"({item.spelling.form} in {item.context}): {accounted.why}"
    )


def _print_details(report: RunReport, args: argparse.Namespace) -> None:
    for file_report in [*report.files, *report.other_files]:
        if args.check and file_report.status == "changed":
            print(f"would migrate: {file_report.path}")
        if args.diff and file_report.diff:
            sys.stdout.write(file_report.diff)
        if file_report.error:
            print(f"error: {one_line(file_report.error)}", file=sys.stderr)
        if args.quiet:
            continue
        for finding in file_report.findings:
            if finding.kind is not FindingKind.SKIP or args.verbose:
                print(format_finding(file_report.path, finding), file=sys.stderr)
        for accounted in file_report.inventory:
            if accounted.outcome is not Outcome.REWRITTEN and not accounted.reported:
                print(format_item(file_report.path, accounted), file=sys.stderr)
    sys.stdout.flush()


def _list_rules(stream: TextIO) -> None:
    table = load_renames()
    for rule in RULES:
        rows = len(table.of_kind(*rule.kinds))
        kinds = "/".join(kind.value for kind in rule.kinds)
        print(f"{rule.code}  {rule.name:<24} {rule.summary} [{rows} {kinds} rows]", file=stream)


def _split(entries: Sequence[str]) -> list[str]:
    return [part for entry in entries for part in entry.split(",") if part.strip()]


def _progress(reports: Iterator[FileReport], total: int) -> Iterator[FileReport]:
    """A bar on a terminal; elsewhere (CI logs) one line per tenth of the files."""
    if sys.stderr.isatty():
        yield from tqdm(reports, total=total, file=sys.stderr, unit="file", desc="migrating", leave=False)
        return
    step = max(1, total // 10)
    for done, report in enumerate(reports, start=1):
        if done % step == 0 or done == total:
            print(f"migrating: {done}/{total} files ({100 * done // total}%)", file=sys.stderr, flush=True)
        yield report


if __name__ == "__main__":
    sys.exit(main())
