"""The inventory: every legacy spelling in every text file of a tree, and what became of each one.

The rules rewrite what they can tie to the legacy API; the inventory makes sure nothing else passes unnoticed. It
finds every occurrence of a legacy spelling (:mod:`.spellings`, derived from the rename table alone) in the files a
run reads, Python sources and config files, scripts, Dockerfiles and notebooks alike, and ends each one in exactly
one of three outcomes:

- **rewritten**: the migrated text no longer holds it (every rewrite passed the rules' API checks and the run's
  post-condition);
- **TODO**: it stays, in a statement marked with a ``# TODO(cudagraph-migrate)`` comment;
- **listed**: it stays, and the report names it (file, line, column, the spelling, why it was left, the new
  spelling).

The outcome is read off the texts, not off the rules' bookkeeping: an occurrence is rewritten when the migrated
text lacks it, marked when a TODO stands above its statement. So an occurrence no rule knows still ends up listed,
and ``accounted: N of N`` holds by construction; the tests check the inventory itself is complete (a hypothesis
property places spellings in random contexts and file kinds).

Comments are not inventoried (the TODO comments themselves name legacy spellings); strings, docstrings and code
are. Adjacent and ``+``-joined literals count as the string they make.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath

from .line_moves import moved_lines
from .renames import load_renames
from .rules.base import Finding, FindingKind
from .spellings import LegacySpelling, SpellingForm, SpellingSet, legacy_spellings
from .text_scan import PythonSpans, StringPiece, line_starts, position, python_spans, spelling_tokens
from .todo_comments import CONTINUATION, TODO_MARKER

__all__ = [
    "AccountedItem",
    "Accounting",
    "FileKind",
    "InventoryItem",
    "Outcome",
    "account_migration",
    "account_other_file",
    "account_python",
    "account_unchanged",
    "file_kind",
    "inventory",
    "is_python_path",
]


class FileKind(str, enum.Enum):
    """The kinds of text file the inventory reads, by how their comments and keys are written."""

    PYTHON = "Python"
    YAML = "YAML"
    JSON = "JSON"
    TOML = "TOML"
    INI = "INI"
    SHELL = "shell script"
    DOCKERFILE = "Dockerfile"
    NOTEBOOK = "notebook"


_SUFFIXES: Mapping[str, FileKind] = {
    ".py": FileKind.PYTHON,
    ".pyi": FileKind.PYTHON,
    ".yaml": FileKind.YAML,
    ".yml": FileKind.YAML,
    ".json": FileKind.JSON,
    ".toml": FileKind.TOML,
    ".cfg": FileKind.INI,
    ".ini": FileKind.INI,
    ".sh": FileKind.SHELL,
    ".bash": FileKind.SHELL,
    ".ipynb": FileKind.NOTEBOOK,
    ".dockerfile": FileKind.DOCKERFILE,
}


def file_kind(path: str | PurePath) -> FileKind | None:
    """The kind of text file ``path`` names, or None for a file the inventory does not read."""
    name = PurePath(path).name
    if name.startswith("Dockerfile") or name.startswith("Containerfile"):
        return FileKind.DOCKERFILE
    return _SUFFIXES.get(PurePath(name).suffix.lower())


def is_python_path(path: str | PurePath) -> bool:
    """Whether ``path`` is a Python source the rules migrate."""
    return file_kind(path) is FileKind.PYTHON


class Outcome(str, enum.Enum):
    """What became of one inventory item."""

    REWRITTEN = "rewritten"
    TODO = "todo"
    LISTED = "listed"


@dataclass(frozen=True)
class InventoryItem:
    """One occurrence of a legacy spelling: its place (1-based line and column of the text as read) and where in
    the text's structure it stands."""

    line: int
    column: int
    spelling: LegacySpelling
    context: str
    """``code``, ``string``, ``string assembled from pieces``, ``key``, ``value``, ``argument``."""


@dataclass(frozen=True)
class AccountedItem:
    """An inventory item and its outcome, with why it was left (for a TODO or a listed one)."""

    item: InventoryItem
    outcome: Outcome
    why: str = ""
    not_tied: bool = False
    """A rule checked the place and found it is not the legacy API (another program's same-spelled name): listed,
    printed with ``-v``, and not a legacy spelling left for ``--strict``."""
    reported: bool = False
    """A rule's finding on the same line already names the place in the report."""

    @property
    def left(self) -> bool:
        """Whether a legacy spelling is left here (what ``--strict`` fails on)."""
        return self.outcome is not Outcome.REWRITTEN and not self.not_tied


def inventory(text: str, kind: FileKind, spellings: SpellingSet) -> list[InventoryItem]:
    """Every legacy spelling in ``text`` (a file of ``kind``), in order."""
    if kind is FileKind.PYTHON:
        if not _python_mentions(text, spellings):
            return []
    elif kind is not FileKind.NOTEBOOK and not spellings.mentioned_in(text):
        return []  # a notebook's cells are tested once read out of its JSON (quotes there are escaped)
    if kind is FileKind.PYTHON:
        return _python_items(text, spellings)
    if kind is FileKind.NOTEBOOK:
        return _notebook_items(text, spellings)
    return _config_items(text, kind, spellings)


_LITERAL_JOINT = re.compile(r"""["'](?:[ \t]|\\?\n|\+)+[rRbBuUfF]{0,2}["']""")
"""Where two literals meet (adjacent or ``+``-joined): removed, an anchor split between them shows."""


def _python_mentions(text: str, spellings: SpellingSet) -> bool:
    """Whether the Python ``text`` may hold a legacy spelling, also one split between literals that make one
    string."""
    return spellings.mentioned_in(text) or spellings.mentioned_in(_LITERAL_JOINT.sub("", text))


def _python_items(text: str, spellings: SpellingSet, spans: PythonSpans | None = None) -> list[InventoryItem]:
    hits = spelling_tokens(text, spellings)
    spans = spans or python_spans(text)
    starts = line_starts(text)
    places: dict[int, tuple[LegacySpelling, str]] = {}
    for hit in hits:
        if spans.in_comment(hit.offset):
            continue
        places[hit.offset] = (hit.spelling, "string" if spans.in_string(hit.offset) else "code")
    for group in spans.groups:
        if len(group) > 1:
            for (start, end), found in _assembled(text, group, spellings).items():
                for offset in [offset for offset in places if start <= offset <= end]:
                    del places[offset]  # a piece's shorter spelling inside the one the pieces make
                places[start] = found
    items = []
    for offset in sorted(places):
        spelling, context = places[offset]
        line, column = position(starts, offset)
        items.append(InventoryItem(line, column, spelling, context))
    return _legacy_here(items)


def _assembled(
    text: str, group: Sequence[StringPiece], spellings: SpellingSet
) -> dict[tuple[int, int], tuple[LegacySpelling, str]]:
    """Spellings that only the joined literals of ``group`` make (one that a single literal holds is found already),
    by the source offsets of their first and last characters."""
    offsets: list[int] = []
    piece_of: list[int] = []
    value_parts: list[str] = []
    for index, piece in enumerate(group):
        value_parts.append(text[piece.content_start : piece.content_end])
        offsets.extend(range(piece.content_start, piece.content_end))
        piece_of.extend([index] * (piece.content_end - piece.content_start))
    value = "".join(value_parts)
    found = {}
    for hit in spelling_tokens(value, spellings):
        last = hit.offset + len(hit.spelling.text) - 1
        if last < len(value) and piece_of[hit.offset] != piece_of[last]:
            found[(offsets[hit.offset], offsets[last])] = (hit.spelling, "string assembled from pieces")
    return found


def _legacy_here(items: list[InventoryItem]) -> list[InventoryItem]:
    """``items`` less the spellings of a still-shipped module (SGLang's EAGLE runners), unless the file also uses a
    retired legacy module: elsewhere they are that engine's current API."""
    retired = any(
        item.spelling.form in (SpellingForm.MODULE, SpellingForm.SYMBOL) and not item.spelling.still_shipped
        for item in items
    )
    return items if retired else [item for item in items if not item.spelling.still_shipped]


_COMMENT_STARTS: Mapping[FileKind, tuple[str, ...]] = {
    FileKind.YAML: ("#",),
    FileKind.TOML: ("#",),
    FileKind.INI: ("#", ";"),
    FileKind.SHELL: ("#",),
    FileKind.DOCKERFILE: ("#",),
    FileKind.JSON: (),
}


def _config_items(text: str, kind: FileKind, spellings: SpellingSet) -> list[InventoryItem]:
    starts = line_starts(text)
    items = []
    for hit in spelling_tokens(text, spellings):
        line, column = position(starts, hit.offset)
        line_text = text[starts[line - 1] : hit.offset]
        if _after_comment_start(line_text, _COMMENT_STARTS[kind]):
            continue
        items.append(InventoryItem(line, column, hit.spelling, _config_context(text, hit, kind)))
    return items


def _after_comment_start(before: str, markers: tuple[str, ...]) -> bool:
    """Whether a comment has started on the line before the hit (a marker outside quotes, at the line's start or
    after a blank)."""
    quote = ""
    for index, char in enumerate(before):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in markers and (index == 0 or before[index - 1] in " \t"):
            return True
    return False


def _config_context(text: str, hit, kind: FileKind) -> str:
    end = hit.offset + len(hit.spelling.text)
    rest = text[end : end + 3].lstrip("'\" \t")
    if kind in (FileKind.SHELL, FileKind.DOCKERFILE):
        return "argument"
    if rest.startswith(":") and kind in (FileKind.YAML, FileKind.JSON):
        return "key"
    if rest.startswith("=") and kind in (FileKind.TOML, FileKind.INI):
        return "key"
    return "value"


def _notebook_items(text: str, spellings: SpellingSet) -> list[InventoryItem]:
    """Code cells read as Python, each line placed where the notebook's JSON holds it."""
    try:
        notebook = json.loads(text)
    except ValueError:
        return _config_items(text, FileKind.JSON, spellings)
    starts = line_starts(text)
    items: list[InventoryItem] = []
    cursor = 0
    for cell in notebook.get("cells", []) if isinstance(notebook, dict) else []:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", [])
        lines = source.splitlines(keepends=True) if isinstance(source, str) else list(source)
        located = []
        for line in lines:
            encoded = json.dumps(line)[1:-1]
            found = text.find(encoded, cursor)
            located.append(found)
            if found != -1:
                cursor = found + len(encoded)
        cell = "".join(lines)
        for item in _python_items(cell, spellings) if _python_mentions(cell, spellings) else []:
            where = located[item.line - 1] if item.line - 1 < len(located) else -1
            if where == -1:
                items.append(item)
                continue
            prefix = json.dumps(lines[item.line - 1][: item.column - 1])[1:-1]
            line, column = position(starts, where + len(prefix))
            items.append(InventoryItem(line, column, item.spelling, item.context))
    return items


def account_unchanged(
    items: Iterable[InventoryItem], why: str, findings: Sequence[Finding] = ()
) -> list[AccountedItem]:
    """Items of a text left as it was: each one listed, with ``why`` unless a finding on its line says more."""
    by_line = _findings_by_line(findings)
    accounted = []
    for item in items:
        finding = _finding_for(item, by_line)
        if finding is not None and finding.kind is FindingKind.TODO:
            accounted.append(AccountedItem(item, Outcome.TODO, finding.message, reported=True))
        elif finding is not None:
            not_tied = finding.kind is FindingKind.SKIP
            accounted.append(AccountedItem(item, Outcome.LISTED, finding.message, not_tied, reported=True))
        else:
            accounted.append(AccountedItem(item, Outcome.LISTED, why))
    return accounted


def account_python(
    original: str, migrated: str, findings: Sequence[Finding], spellings: SpellingSet
) -> list[AccountedItem]:
    """Each legacy spelling of the Python text ``original`` with what the migration to ``migrated`` did with it;
    ``findings`` (on ``original``'s lines) say why a place was left."""
    before = inventory(original, FileKind.PYTHON, spellings)
    if not before:
        return []
    if migrated == original:
        after_items, after_spans = before, None
    else:
        after_spans = python_spans(migrated)
        after_items = _python_items(migrated, spellings, after_spans) if _python_mentions(migrated, spellings) else []
    remaining = _match(before, after_items, original, migrated)
    marked = _todo_lines(migrated, after_spans or python_spans(migrated)) if TODO_MARKER in migrated else {}
    by_line = _findings_by_line(findings)
    legacy_engine_file = _names_legacy_engine(original, spellings)
    lines = original.splitlines()
    accounted = []
    for item in before:
        if item not in remaining:
            accounted.append(AccountedItem(item, Outcome.REWRITTEN))
            continue
        finding = _finding_for(item, by_line)
        todo = marked.get(remaining[item].line)
        if todo is not None or (finding is not None and finding.kind is FindingKind.TODO):
            why = finding.message if finding is not None and finding.kind is FindingKind.TODO else str(todo)
            accounted.append(AccountedItem(item, Outcome.TODO, why, reported=finding is not None))
        elif finding is not None and finding.kind is FindingKind.SKIP and legacy_engine_file and _defines(item, lines):
            accounted.append(AccountedItem(item, Outcome.LISTED, _hook_why(item)))
        elif finding is not None:
            not_tied = finding.kind is FindingKind.SKIP
            accounted.append(AccountedItem(item, Outcome.LISTED, finding.message, not_tied, reported=True))
        else:
            accounted.append(AccountedItem(item, Outcome.LISTED, _unruled_why(item)))
    return accounted


def _names_legacy_engine(text: str, spellings: SpellingSet) -> bool:
    """Whether the Python ``text`` imports a legacy engine's package (SGLang's, pymllm's): the packages of the table's
    legacy modules."""
    return any(f"import {package}" in text or f"from {package}" in text for package in spellings.engine_packages)


def _defines(item: InventoryItem, lines: Sequence[str]) -> bool:
    """Whether the item is the name of a ``def``."""
    before = lines[item.line - 1][: item.column - 1] if item.line <= len(lines) else ""
    return before.rstrip().endswith("def") and item.spelling.row.kind.value == "method"


def _hook_why(item: InventoryItem) -> str:
    return (
        f"a method named like the legacy runners' {item.spelling.text} in a file of the legacy engine, on a class "
        f"that is not a runner: the legacy runner calls a hook of this name (a plugin's), the new one never will "
        f"(its hook is {item.spelling.new}): move what it does there by hand"
    )


def _unruled_why(item: InventoryItem) -> str:
    if item.context == "code":
        return (
            "left as written: no rule could tie it to the legacy API and move it (an unknown receiver or owner), or "
            "a legacy import that stays binds it"
        )
    return f"a legacy spelling in a {item.context}: strings are rewritten only where a rule knows what reads them"


def _match(
    before: Sequence[InventoryItem], after: Sequence[InventoryItem], original: str, migrated: str
) -> dict[InventoryItem, InventoryItem]:
    """Each item of ``before`` that ``after`` still holds -> its place in ``after`` (the same spelling on the line the
    migration moved its line to, else the nearest one left)."""
    if original == migrated:
        return {item: item for item in before}
    moved = moved_lines(original.splitlines(), migrated.splitlines())
    back = {new: old for old, new in moved.items()}
    unmatched: dict[str, list[InventoryItem]] = {}
    for item in before:
        unmatched.setdefault(item.spelling.text, []).append(item)
    remaining: dict[InventoryItem, InventoryItem] = {}
    changed: list[InventoryItem] = []
    for later in after:
        candidates = unmatched.get(later.spelling.text)
        if not candidates:
            changed.append(later)
            continue
        guess = back.get(later.line, later.line)
        best = min(candidates, key=lambda item: (abs(item.line - guess), abs(item.column - later.column)))
        candidates.remove(best)
        remaining[best] = later
    for later in changed:
        # a spelling the migration reshaped but did not remove (a qualified name whose module part was rewritten
        # still holds its legacy bare name): the place it came from is not rewritten
        guess = back.get(later.line, later.line)
        candidates = [
            item
            for items in unmatched.values()
            for item in items
            if later.spelling.text in item.spelling.text and abs(item.line - guess) <= 1
        ]
        if candidates:
            best = min(candidates, key=lambda item: (abs(item.line - guess), abs(item.column - later.column)))
            unmatched[best.spelling.text].remove(best)
            remaining[best] = later
    return remaining


def _findings_by_line(findings: Sequence[Finding]) -> dict[int, list[Finding]]:
    by_line: dict[int, list[Finding]] = {}
    for finding in findings:
        by_line.setdefault(finding.line, []).append(finding)
    return by_line


def _finding_for(item: InventoryItem, by_line: Mapping[int, list[Finding]]) -> Finding | None:
    """The finding on the item's line that names it (any one on the line otherwise), TODOs first."""
    found = by_line.get(item.line)
    if not found:
        return None
    ranked = sorted(found, key=lambda finding: (finding.kind is not FindingKind.TODO, finding.kind is FindingKind.SKIP))
    named = [finding for finding in ranked if item.spelling.text in finding.message]
    return (named or ranked)[0]


def _todo_lines(text: str, spans: PythonSpans) -> dict[int, str]:
    """Line -> the TODO standing above the statement that line belongs to (its header, for a compound statement)."""
    lines = text.splitlines()
    starts = line_starts(text)
    marked: dict[int, str] = {}
    index = 0
    while index < len(lines):
        stripped = lines[index].strip()
        if not stripped.startswith(TODO_MARKER):
            index += 1
            continue
        block = [stripped]
        index += 1
        while index < len(lines) and lines[index].strip().startswith((CONTINUATION.strip(), TODO_MARKER)):
            block.append(lines[index].strip())
            index += 1
        while index < len(lines) and (not lines[index].strip() or lines[index].strip().startswith("#")):
            index += 1
        if index >= len(lines):
            break
        first = index
        last = _statement_end(text, starts, spans, first)
        todo = " ".join(block)
        for line in range(first + 1, last + 2):
            marked.setdefault(line, todo)
        index = last + 1
    return marked


def _statement_end(text: str, starts: Sequence[int], spans: PythonSpans, first: int) -> int:
    """The 0-based last line of the logical line starting on 0-based line ``first`` (a decorator's function or
    class header included)."""
    line = first
    while True:
        end = _logical_end(text, starts, spans, line)
        if not text[starts[line] :].lstrip().startswith("@") or end + 1 >= len(starts):
            return end
        line = end + 1


def _logical_end(text: str, starts: Sequence[int], spans: PythonSpans, line: int) -> int:
    depth = 0
    offset = starts[line]
    size = len(text)
    while offset < size:
        char = text[offset]
        if char in "'\"" and spans.in_string(offset):
            offset = _string_end(spans, offset)
            continue
        if char == "#":
            newline = text.find("\n", offset)
            offset = size if newline == -1 else newline
            continue
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(0, depth - 1)
        elif char == "\n" and depth == 0 and (offset == 0 or text[offset - 1] != "\\"):
            return position(starts, offset)[0] - 1
        offset += 1
    return len(starts) - 1


def _string_end(spans: PythonSpans, offset: int) -> int:
    for piece in spans.strings:
        if piece.start <= offset < piece.end:
            return piece.end
    return offset + 1


@dataclass(frozen=True)
class Accounting:
    """The inventory's totals: what the summary's ``accounted:`` line prints and ``--strict`` reads."""

    total: int = 0
    rewritten: int = 0
    todos: int = 0
    listed: int = 0
    not_tied: int = 0
    """Of the listed: places a rule found are not the legacy API (another program's same-spelled name)."""

    @classmethod
    def of(cls, items: Iterable[AccountedItem]) -> Accounting:
        """The totals of ``items``."""
        counts = {outcome: 0 for outcome in Outcome}
        total = not_tied = 0
        for accounted in items:
            total += 1
            counts[accounted.outcome] += 1
            not_tied += accounted.not_tied
        return cls(total, counts[Outcome.REWRITTEN], counts[Outcome.TODO], counts[Outcome.LISTED], not_tied)

    @property
    def accounted(self) -> int:
        """Items with an outcome (every one: an item without is a bug of the tool)."""
        return self.rewritten + self.todos + self.listed

    @property
    def left(self) -> int:
        """Legacy spellings left: TODOs and listed places, less those found not to be the legacy API."""
        return self.todos + self.listed - self.not_tied

    def line(self) -> str:
        """``accounted: N of N legacy spellings (R rewritten, T TODOs, L listed)``."""
        return (
            f"accounted: {self.accounted} of {self.total} legacy spellings ({self.rewritten} rewritten, "
            f"{self.todos} TODOs, {self.listed} listed)"
        )


def account_migration(
    original: bytes,
    migrated: bytes | None,
    findings: Sequence[Finding],
    table_path: str | None = None,
    *,
    why: str = "",
) -> list[AccountedItem]:
    """The inventory of a Python file's ``original`` bytes after its migration to ``migrated`` (None: the file was
    left as it was, for ``why``)."""
    spellings = legacy_spellings(load_renames(table_path))
    text = original.decode("utf-8", errors="replace")
    if migrated is None:
        return account_unchanged(inventory(text, FileKind.PYTHON, spellings), why, findings)
    return account_python(text, migrated.decode("utf-8", errors="replace"), findings, spellings)


_CONFIG_WHY: Mapping[str, str] = {
    "key": "a legacy option key in a {kind} file (--rewrite-config rewrites YAML, TOML and JSON keys)",
    "value": "a legacy spelling in a {kind} file's value",
    "argument": "a legacy flag or option in a {kind}'s command line",
}


def account_other_file(text: str, path: str, table_path: str | None = None) -> list[AccountedItem]:
    """The inventory of a text file that is not Python: every item listed, saying where it stands."""
    kind = file_kind(path) or FileKind.PYTHON
    spellings = legacy_spellings(load_renames(table_path))
    accounted = []
    for item in inventory(text, kind, spellings):
        template = _CONFIG_WHY.get(item.context, "a legacy spelling in a {kind} file's {context}")
        why = template.format(kind=kind.value, context=item.context)
        accounted.append(AccountedItem(item, Outcome.LISTED, why))
    return accounted
