"""Migrate many files, in worker processes when asked, and gather one report.

Each worker reads, migrates and (unless only checking) writes its file itself, so results never travel back as whole
file contents; only the diff does, when one was asked for. Files go to the workers in chunks, and each worker loads
the rename table, the exports manifest and the rules once.

Ctrl-C (SIGINT, to this process or to its whole process group) stops a run within moments at any job count: a file
being written is finished (the write is one rename), every other file is left as it was, and :func:`migrate_files`
returns a report marked :attr:`RunReport.interrupted` holding the files that were done. No worker prints a traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from .config_files import rewrite_config_keys
from .exports import load_exports
from .files import atomic_write, patch_base
from .inventory import (
    AccountedItem,
    Accounting,
    FileKind,
    Outcome,
    account_migration,
    account_other_file,
    file_kind,
    is_python_path,
)
from .line_moves import moved_lines
from .options import RunOptions
from .python_ast import syntax_error
from .reexports import collect_reexports
from .renames import load_renames
from .rules import Rule, rule_prefilter, select_rules
from .rules.base import Finding, FindingKind
from .source_migration import (
    MigrationError,
    SourceMigration,
    UnparsableSourceError,
    migrate_source,
    reexport_markers,
)

__all__ = [
    "FileReport",
    "MigrationOptions",
    "RunReport",
    "migrate_file",
    "migrate_files",
    "one_line",
    "unified_patch",
    "with_project_reexports",
]


@dataclass(frozen=True)
class MigrationOptions:
    """What to run and what to do with the result."""

    rule_codes: tuple[str, ...]
    """The selected rules, by code (workers rebuild the rule list from these)."""
    write: bool = True
    """Rewrite changed files in place."""
    diff: bool = False
    """Return a ``git apply``-able patch of each changed file."""
    table_path: str | None = None
    """The rename table to read (default: the installed one)."""
    run: RunOptions = field(default_factory=RunOptions)
    """Switches the rules read (``--rewrite-argv``)."""
    patch_root: str | None = None
    """Name the patch's files relative to this folder (default: see :attr:`patch_bases`)."""
    patch_bases: tuple[str, ...] = ()
    """The paths the files were found under: a patch names each file relative to the top of its git work tree, or
    outside a repository to the path it was found under (:func:`cudagraph.migrate.files.patch_base`)."""
    rewrite_config: bool = False
    """Rename legacy option keys of YAML, TOML and JSON files in place (``--rewrite-config``)."""


@dataclass
class FileReport:
    """What happened to one file."""

    path: str
    status: str
    """``changed``, ``unchanged``, ``failed``, or ``interrupted`` (Ctrl-C came first: left as it was)."""
    edits: dict[str, int] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None
    diff: str | None = None
    warning: str | None = None
    """Something the user should hear about a file left as it was (one that names nothing legacy but does not
    parse)."""
    parsed: bool = False
    """Whether the file got past the text prefilter and the parser read it (one that does not parse is not
    counted: it is ``failed``)."""
    inventory: list[AccountedItem] = field(default_factory=list)
    """Every legacy spelling of the file as read, with what became of it (see :mod:`.inventory`)."""

    def of_kind(self, kind: FindingKind) -> list[Finding]:
        """The findings of one kind."""
        return [finding for finding in self.findings if finding.kind is kind]


@dataclass
class RunReport:
    """Every file's report, in input order, with the totals the summary prints."""

    files: list[FileReport]
    rules: Sequence[Rule]
    interrupted: bool = False
    """Ctrl-C stopped the run: :attr:`files` holds the files done before it (each written whole, or not at all)."""
    other_files: list[FileReport] = field(default_factory=list)
    """The text files that are not Python (config files, scripts, notebooks): inventoried, never migrated as code."""

    def accounting(self) -> Accounting:
        """The inventory's totals over every file."""
        return Accounting.of(item for report in (*self.files, *self.other_files) for item in report.inventory)

    def count(self, status: str) -> int:
        """Files with ``status``."""
        return sum(report.status == status for report in self.files)

    def parsed(self) -> int:
        """Files that got past the text prefilter."""
        return sum(report.parsed for report in self.files)

    def findings(self, kind: FindingKind) -> int:
        """Findings of one kind over all files."""
        return sum(len(report.of_kind(kind)) for report in self.files)

    def edits_per_rule(self) -> dict[str, tuple[int, int]]:
        """Per rule code: (occurrences rewritten, files touched)."""
        totals = {rule.code: (0, 0) for rule in self.rules}
        for report in self.files:
            for code, edits in report.edits.items():
                occurrences, files = totals[code]
                totals[code] = (occurrences + edits, files + 1)
        return totals


def with_project_reexports(options: MigrationOptions, files: Sequence[Path], roots: Sequence[Path]) -> MigrationOptions:
    """``options`` carrying the legacy names the project's own modules re-export (see :mod:`.reexports`)."""
    found = collect_reexports(files, roots, load_renames(options.table_path), load_exports())
    run = dataclasses.replace(options.run, reexports=tuple(sorted(found.items())))
    return dataclasses.replace(options, run=run)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def migrate_files(
    files: Sequence[Path],
    options: MigrationOptions,
    jobs: int = 1,
    progress: Callable[[Iterator[FileReport], int], Iterator[FileReport]] | None = None,
) -> RunReport:
    """Migrate ``files`` with ``jobs`` processes; ``progress`` wraps the stream of reports (a progress display).

    Ctrl-C ends the run early (see the module's docstring): the report then holds the files done before it, in input
    order, and says it was interrupted.
    """
    rules = _rules(options.rule_codes)
    others = [path for path in files if _is_other_file(path)]
    other_set = set(others)
    files = [path for path in files if path not in other_set]
    other_done: dict[str, FileReport] = {}
    with _sigint_stops_the_run():
        if jobs <= 1 or len(files) <= 1:
            other_done = {str(path): _other_file(path, options) for path in others}
            stream = _in_process(files, options)
        else:  # the other files are inventoried by the workers too, beside the Python files
            stream = _in_workers(files, options, jobs, others, other_done)
        done = {report.path: report for report in (progress(stream, len(files)) if progress else stream)}
    finished = [done[str(path)] for path in files if str(path) in done and done[str(path)].status != "interrupted"]
    other_reports = [other_done[str(path)] for path in others if str(path) in other_done]
    return RunReport(finished, rules, interrupted=_INTERRUPT.requested, other_files=other_reports)


def _in_process(files: Sequence[Path], options: MigrationOptions) -> Iterator[FileReport]:
    for path in files:
        if _INTERRUPT.requested:
            return
        yield migrate_file(path, options)


def _in_workers(
    files: Sequence[Path],
    options: MigrationOptions,
    jobs: int,
    others: Sequence[Path] = (),
    other_done: dict[str, FileReport] | None = None,
) -> Iterator[FileReport]:
    """Reports of ``files`` as worker processes finish them; after Ctrl-C, only those of the tasks already running.
    The workers inventory ``others`` (text files that are not Python) too: their reports go into ``other_done``."""
    heavy, light = _split_by_work(files, options)
    # The few files with legacy names hold nearly all the work: largest first, one per task, so no worker is left
    # with a chunk of them while the other idles; the rest go in large chunks.
    size = max(1, min(64, len(light) // (jobs * 8)))
    tasks = [
        *([path] for path in heavy),
        *(list(others[start : start + size]) for start in range(0, len(others), size)),
        *(light[start : start + size] for start in range(0, len(light), size)),
    ]
    other_paths = {str(path) for path in others}
    collected = other_done if other_done is not None else {}

    def python_reports(reports: list[FileReport]) -> list[FileReport]:
        for report in reports:
            if report.path in other_paths:
                collected[report.path] = report
        return [report for report in reports if report.path not in other_paths]

    pool = ProcessPoolExecutor(max_workers=min(jobs, len(files)), initializer=_worker_started)
    try:
        pending: set[Future[list[FileReport]]] = {pool.submit(_migrate_chunk, task, options) for task in tasks}
        while pending and not _INTERRUPT.requested:
            finished, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
            for future in finished:
                yield from python_reports(future.result())
        if pending:  # interrupted: queued tasks never start, running ones stop at their next file
            for future in pending:
                future.cancel()
            for child in multiprocessing.active_children():
                _signal(child.pid)
            for future in wait([future for future in pending if not future.cancelled()], timeout=5).done:
                yield from python_reports(future.result())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _signal(pid: int | None) -> None:
    """Pass Ctrl-C on to a worker (it may have had it already, from the process group, or be gone)."""
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)


def _migrate_chunk(paths: Sequence[Path], options: MigrationOptions) -> list[FileReport]:
    """Each file of ``paths`` migrated (a Python file) or inventoried (any other text file)."""
    return [_other_file(path, options) if _is_other_file(path) else migrate_file(path, options) for path in paths]


def _is_other_file(path: Path) -> bool:
    """Whether ``path`` is a text file the inventory reads that is not Python (inventoried, never migrated)."""
    return file_kind(path) is not None and not is_python_path(path)


@dataclass
class _InterruptState:
    """This process's Ctrl-C state. ``busy``: inside a file's migration, where Ctrl-C raises to abandon it; ``writing``:
    inside the write, which always finishes (one rename, never half a file)."""

    requested: bool = False
    busy: bool = False
    writing: bool = False


_INTERRUPT = _InterruptState()


def _on_sigint(signum: int, frame: object) -> None:
    first = not _INTERRUPT.requested
    _INTERRUPT.requested = True
    if first and _INTERRUPT.busy and not _INTERRUPT.writing:
        raise KeyboardInterrupt


def _worker_started() -> None:
    # A forked worker inherits the run's state (a Ctrl-C that came first stays seen); a spawned one starts clear.
    signal.signal(signal.SIGINT, _on_sigint)


@contextlib.contextmanager
def _sigint_stops_the_run() -> Iterator[None]:
    """While a run lasts, Ctrl-C in this process asks it to stop (instead of raising wherever it lands)."""
    _INTERRUPT.requested = False
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _split_by_work(files: Sequence[Path], options: MigrationOptions) -> tuple[list[Path], list[Path]]:
    """Files the text prefilter lets through (largest first), and the others (in order)."""
    table = load_renames(options.table_path)
    rules = _rules(options.rule_codes)
    markers = reexport_markers(options.run.reexports)
    prefilter = rule_prefilter(tuple(rules), table)
    heavy: list[tuple[int, Path]] = []
    light: list[Path] = []
    for path in files:
        try:
            data = path.read_bytes()
        except OSError:
            light.append(path)  # the worker reports it
            continue
        text = data.decode("utf-8", errors="replace")
        if prefilter.active(rules, text, str(path), table, markers):
            heavy.append((len(data), path))
        else:
            light.append(path)
    return [path for _, path in sorted(heavy, key=lambda item: -item[0])], light


def migrate_file(path: Path, options: MigrationOptions) -> FileReport:
    """Migrate one file: read, rewrite, and write it back atomically when it changed and writing is on.

    After Ctrl-C (in a run, see :func:`migrate_files`) the file is left as it was and reported ``interrupted``.
    """
    if _INTERRUPT.requested:
        return FileReport(str(path), "interrupted")
    try:
        _INTERRUPT.busy = True
        return _migrate_file(path, options)
    except KeyboardInterrupt:
        return FileReport(str(path), "interrupted")
    finally:
        _INTERRUPT.busy = False


def _migrate_file(path: Path, options: MigrationOptions) -> FileReport:
    try:
        original = path.read_bytes()
    except OSError as error:
        return FileReport(str(path), "failed", error=f"{path}: cannot read: {error.strerror or error}")
    try:
        result = migrate_bytes(original, str(path), options)
    except MigrationError as error:
        if _INTERRUPT.requested:  # Ctrl-C landed inside a rule, which reported it as its own failure
            return FileReport(str(path), "interrupted")
        parsed = not isinstance(error, UnparsableSourceError)
        left = account_migration(
            original, None, [], options.table_path, why=f"the file was left untouched: {one_line(str(error))}"
        )
        return FileReport(str(path), "failed", error=one_line(str(error)), parsed=parsed, inventory=left)
    report = _report(str(path), result)
    report.inventory = account_migration(original, result.migrated, result.findings, options.table_path)
    if not result.parsed:
        report.warning = _unparsable(original, path)
    if not result.changed:
        return report
    if options.diff:
        changed = _link_target(path)  # git patches what a link points to, never the link itself
        root = options.patch_root or patch_base(changed, options.patch_bases)
        report.diff = unified_patch(str(changed), result.original, result.migrated, root=root)
    if options.write:
        if _INTERRUPT.requested:
            return FileReport(str(path), "interrupted")
        _INTERRUPT.writing = True
        try:
            atomic_write(path, result.migrated)
        except OSError as error:
            why = f"the file was left untouched: cannot write it ({error.strerror or error})"
            left = account_migration(original, None, [], options.table_path, why=why)
            return FileReport(
                str(path), "failed", error=f"{path}: cannot write: {error.strerror or error}", inventory=left
            )
        finally:
            _INTERRUPT.writing = False
        report.findings = on_written_lines(report.findings, result.original, result.migrated)
        report.inventory = _items_on_written_lines(report.inventory, result.original, result.migrated)
    return report


def _items_on_written_lines(items: Sequence[AccountedItem], original: bytes, migrated: bytes) -> list[AccountedItem]:
    """The places of the items left (a TODO, a listed one) in the written text, as :func:`on_written_lines` moves the
    findings: a report line points into the file as it now is."""
    before = original.decode("utf-8", "replace").splitlines()
    after = migrated.decode("utf-8", "replace").splitlines()
    moved = moved_lines(before, after)
    return [
        accounted
        if accounted.outcome is Outcome.REWRITTEN
        else dataclasses.replace(
            accounted,
            item=dataclasses.replace(accounted.item, line=moved.get(accounted.item.line, accounted.item.line)),
        )
        for accounted in items
    ]


def _other_file(path: Path, options: MigrationOptions) -> FileReport:
    """A text file that is not Python (a config file, a script, a notebook): inventoried, never migrated as code."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as error:
        return FileReport(str(path), "failed", error=f"{path}: cannot read: {error.strerror or error}")
    items = account_other_file(text, str(path), options.table_path)
    kind = file_kind(path)
    if not options.rewrite_config or kind not in (FileKind.YAML, FileKind.TOML, FileKind.JSON) or not items:
        return FileReport(str(path), "unchanged", inventory=items)
    rewrite = rewrite_config_keys(text, kind, items)
    if rewrite.text == text:
        return FileReport(str(path), "unchanged", inventory=rewrite.items)
    report = FileReport(str(path), "changed", inventory=rewrite.items)
    report.edits["config"] = sum(item.outcome is Outcome.REWRITTEN for item in rewrite.items)
    original, migrated = text.encode("utf-8"), rewrite.text.encode("utf-8")
    if options.diff:
        report.diff = unified_patch(str(path), original, migrated, root=options.patch_root)
    if options.write:
        try:
            atomic_write(path, migrated)
        except OSError as error:
            return FileReport(
                str(path), "failed", error=f"{path}: cannot write: {error.strerror or error}", inventory=items
            )
    return report


def _link_target(path: Path) -> Path:
    """``path``, or where the symbolic link ``path`` leads, spelled from the link's own folder (so a patch names the
    file as the tree spells it, not as the file system resolves every folder above it)."""
    if not path.is_symlink():
        return path
    return Path(os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), os.readlink(path))))


def _unparsable(source: bytes, path: Path) -> str | None:
    """Why ``source``, which the prefilter let no rule see, does not parse as Python (neither the running Python nor
    libcst's grammar reads it); None when it does."""
    error = syntax_error(source, str(path))
    if error is None:
        return None
    if error.lineno is None:  # a NUL byte
        return one_line(f"{path}: does not parse: {error.msg} (it names nothing legacy)")
    return one_line(f"{path}:{error.lineno}:{error.offset}: does not parse: {error.msg} (it names nothing legacy)")


ERROR_WIDTH = 300
"""The most characters of an error's message an ``error:`` line shows."""


def one_line(message: str, width: int = ERROR_WIDTH) -> str:
    """``message`` as one line of at most ``width`` characters: its first line, cut with ``...`` (an exception's
    message can hold a whole syntax tree's repr)."""
    lines = message.strip().splitlines()
    first = lines[0] if lines else ""
    if len(first) > width or len(lines) > 1:
        return first[: width - 3].rstrip() + "..." if len(first) > width - 3 else first + " ..."
    return first


def on_written_lines(findings: Sequence[Finding], original: bytes, migrated: bytes) -> list[Finding]:
    """``findings`` (lines of ``original``) moved onto the same statements in ``migrated``, the text a user opens
    after a writing run: TODO comments written above a statement push it, and everything after it, down."""
    if original == migrated:
        return list(findings)
    before = original.decode("utf-8", "replace").splitlines()
    after = migrated.decode("utf-8", "replace").splitlines()
    moved = moved_lines(before, after)
    return [dataclasses.replace(finding, line=moved.get(finding.line, finding.line)) for finding in findings]


def migrate_bytes(source: bytes, path: str, options: MigrationOptions) -> SourceMigration:
    """Migrate ``source`` as the file at ``path`` with ``options``' rules and table (no I/O)."""
    return migrate_source(source, path, _rules(options.rule_codes), load_renames(options.table_path), options.run)


def _report(path: str, result: SourceMigration) -> FileReport:
    status = "changed" if result.changed else "unchanged"
    return FileReport(path, status, edits=result.edits, findings=result.findings, parsed=result.parsed)


@functools.lru_cache(maxsize=16)
def _rules(codes: tuple[str, ...]) -> list[Rule]:
    return select_rules(select=codes) if codes else []


def unified_patch(path: str, before: bytes, after: bytes, root: str | None = None) -> str:
    """A ``git apply -p1``-able unified diff (``a/`` and ``b/`` sides, relative to ``root``, or to the working
    directory when inside it).

    libcst's ``diff_code`` names both sides with one filename and drops the marker for a last line without a
    newline, so the patch is built here with :mod:`difflib` on lines that keep their endings.
    """
    relative = os.path.relpath(path, root) if root is not None else os.path.relpath(path)
    name = Path(path).as_posix().lstrip("/") if relative.startswith("..") else Path(relative).as_posix()
    old = before.decode("utf-8", errors="surrogateescape").splitlines(keepends=True)
    new = after.decode("utf-8", errors="surrogateescape").splitlines(keepends=True)
    lines = []
    for line in difflib.unified_diff(old, new, fromfile=f"a/{name}", tofile=f"b/{name}"):
        lines.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(lines)
