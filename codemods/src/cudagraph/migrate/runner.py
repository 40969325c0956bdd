"""Migrate many files, in worker processes when asked, and gather one report.

Each worker reads, migrates and (unless only checking) writes its file itself, so results never travel back as
whole file contents; only the diff does, when one was asked for.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .engine import MigrationError, migrate_source
from .files import atomic_write
from .renames import load_renames
from .rules import Rule, select_rules

__all__ = ["FileReport", "MigrationOptions", "RunReport", "migrate_files"]


@dataclass(frozen=True)
class MigrationOptions:
    """What to run and what to do with the result."""

    rule_codes: tuple[str, ...]
    """The selected rules, by code (workers rebuild the rule list from these)."""
    write: bool = True
    """Rewrite changed files in place."""
    diff: bool = False
    """Return a unified diff of each changed file."""
    table_path: str | None = None
    """The rename table to read (default: the installed one)."""


@dataclass
class FileReport:
    """What happened to one file."""

    path: str
    status: str
    """``changed``, ``unchanged`` or ``failed``."""
    edits: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    diff: str | None = None


@dataclass
class RunReport:
    """Every file's report, in input order, with the totals the summary prints."""

    files: list[FileReport]
    rules: Sequence[Rule]

    def count(self, status: str) -> int:
        """Files with ``status``."""
        return sum(report.status == status for report in self.files)

    def edits_per_rule(self) -> dict[str, tuple[int, int]]:
        """Per rule code: (occurrences rewritten, files touched)."""
        totals = {rule.code: (0, 0) for rule in self.rules}
        for report in self.files:
            for code, edits in report.edits.items():
                occurrences, files = totals[code]
                totals[code] = (occurrences + edits, files + 1)
        return totals


def migrate_files(
    files: Sequence[Path],
    options: MigrationOptions,
    jobs: int = 1,
    progress: Callable[[Iterator[FileReport], int], Iterator[FileReport]] | None = None,
) -> RunReport:
    """Migrate ``files`` with ``jobs`` processes; ``progress`` wraps the stream of reports (a progress bar)."""
    worker = functools.partial(migrate_file, options=options)
    rules = _rules(options.rule_codes)
    if jobs <= 1 or len(files) <= 1:
        stream: Iterator[FileReport] = map(worker, files)
        reports = list(progress(stream, len(files)) if progress else stream)
        return RunReport(reports, rules)
    chunksize = max(1, len(files) // (jobs * 16))
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        stream = pool.map(worker, files, chunksize=chunksize)
        reports = list(progress(stream, len(files)) if progress else stream)
    return RunReport(reports, rules)


def migrate_file(path: Path, options: MigrationOptions) -> FileReport:
    """Migrate one file: read, rewrite, and write it back atomically when it changed and writing is on."""
    try:
        original = path.read_bytes()
    except OSError as error:
        return FileReport(str(path), "failed", error=f"{path}: cannot read: {error.strerror or error}")
    table = load_renames(options.table_path)
    try:
        result = migrate_source(original, str(path), _rules(options.rule_codes), table)
    except MigrationError as error:
        return FileReport(str(path), "failed", error=str(error))
    if not result.changed:
        return FileReport(str(path), "unchanged", notes=result.notes)
    diff = _unified_diff(path, result.original, result.migrated) if options.diff else None
    if options.write:
        try:
            atomic_write(path, result.migrated)
        except OSError as error:
            return FileReport(str(path), "failed", error=f"{path}: cannot write: {error.strerror or error}")
    return FileReport(str(path), "changed", edits=result.edits, notes=result.notes, diff=diff)


@functools.lru_cache(maxsize=16)
def _rules(codes: tuple[str, ...]) -> list[Rule]:
    return select_rules(select=codes) if codes else []


def _unified_diff(path: Path, before: bytes, after: bytes) -> str:
    old = before.decode("utf-8", errors="replace").splitlines(keepends=True)
    new = after.decode("utf-8", errors="replace").splitlines(keepends=True)
    return "".join(difflib.unified_diff(old, new, fromfile=str(path), tofile=str(path)))
