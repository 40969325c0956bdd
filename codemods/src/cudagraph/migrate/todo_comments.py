"""The ``# TODO(cudagraph-migrate): ...`` comments that mark every place a migration could not move.

A rule that leaves legacy code as written (the new API lacks a member, a call would not bind, the class is not
ours) says so at the place, the way bump-pydantic writes ``# TODO[pydantic]``: a comment above the statement, naming
what is missing and the command that prints how to move it by hand (``cudagraph-migrate --explain CODE``, the
migration guide's sections for that rule, shipped with the tool). A long one is wrapped at :data:`WIDTH` columns,
each further line starting with :data:`CONTINUATION`, so the marker stays first and ``grep`` finds one line per
TODO::

    # TODO(cudagraph-migrate): kept on the legacy CudaGraphRunner: DecodeCudaGraphRunner(model_runner,
    #   config, *, backend=...) does not take this call: missing required argument 'config' — see
    #   cudagraph-migrate --explain CG101

Comments are only ever added, never removed, and a TODO already above the statement is not written again, whether
it was written wrapped (at any width) or on one line, or by earlier versions that pointed at the guide by file and
anchor (``— see migration-guide.md#...``): a TODO is the same TODO whatever its pointer, so a second run changes
nothing.

This module owns the wording, the wrapping and the placement; the rules decide where a comment is due (see
``MigrationCommand.note``).
"""

from __future__ import annotations

import enum
import io
import re
import textwrap
import tokenize
from collections.abc import Collection, Iterable, Iterator, Sequence

import libcst as cst

__all__ = [
    "CONTINUATION",
    "EXPLAIN",
    "GUIDE",
    "TODO_MARKER",
    "WIDTH",
    "GuideSection",
    "todo_comments_in",
    "todo_identity",
    "todo_lines",
    "todo_text",
    "todos_in",
    "with_todo_comments",
    "without_todos",
]

TODO_MARKER = "# TODO(cudagraph-migrate):"
"""How every comment starts (what ``grep`` and the tests look for)."""

CONTINUATION = "#   "
"""How each further line of a wrapped TODO starts."""

WIDTH = 100
"""The most characters a line of a TODO comment holds, its indentation aside (a longer word gets a line of its own)."""

GUIDE = "migration-guide.md"
"""The guide whose sections ``--explain`` prints (``refactor/migration-guide.md`` in the source tree, shipped in the
wheel)."""

EXPLAIN = "cudagraph-migrate --explain"
"""The command a TODO names, followed by its rule's code."""

_POINTER = " — see "
"""What separates a TODO's message from its pointer to the manual steps."""


class GuideSection(str, enum.Enum):
    """The sections of the migration guide's "Manual steps" part, by anchor."""

    MANUAL_STEPS = "manual-steps"
    SUBCLASSES = "subclasses-of-the-legacy-runners"
    CALLS = "calls-the-new-api-does-not-accept"
    SHARED_STATE = "state-shared-with-the-legacy-runner"
    ENGINE_MEMBERS = "members-of-engine-classes-that-are-not-ours"
    NAMES_THAT_STAY = "names-only-the-legacy-module-has"
    MODULE_OBJECTS = "legacy-modules-used-as-objects"
    STAR_IMPORTS = "star-imports"
    RUN_TIME_VALUES = "values-known-only-at-run-time"
    OTHER_ENGINES = "other-engines-options"
    FLAG_DEFINITIONS = "flag-definitions"
    HANDOFFS = "legacy-classes-handed-on-as-values"
    PATCHED_CLASSES = "patched-legacy-classes"
    MEMBER_STRINGS = "strings-naming-legacy-members"


def todo_text(message: str, code: str) -> str:
    """The TODO for ``message``, written by the rule ``code``, as one line (:func:`todo_lines` wraps it for the file);
    it ends naming the command that prints the rule's manual steps."""
    one_line = " ".join(message.split())
    return f"{TODO_MARKER} {one_line}{_POINTER}{EXPLAIN} {code}"


def todo_identity(text: str) -> str:
    """What makes two TODOs the same: the marker and the message, whatever the pointer after them (this version's
    command, or an earlier version's guide anchor)."""
    return text.rsplit(_POINTER, 1)[0] if _POINTER in text else text


def todo_lines(text: str) -> list[str]:
    """The comment lines that write ``text`` (a :func:`todo_text`): wrapped between words at :data:`WIDTH` columns,
    never inside a word (a flag, a path) nor inside the closing ``cudagraph-migrate --explain CODE``, each line after
    the first starting with :data:`CONTINUATION`. Joining the lines back with single spaces gives ``text``."""
    # the command at the end stays on one line, so it can be copied (and found with grep) whole
    message, pointer, command = text.removeprefix("# ").rpartition(f"{_POINTER}{EXPLAIN} ")
    kept = f"{message}{pointer}{command}" if not pointer else f"{message}{_POINTER}{_unbroken(EXPLAIN)}\0{command}"
    lines = textwrap.wrap(
        kept,
        width=WIDTH,
        initial_indent="# ",
        subsequent_indent=CONTINUATION,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [line.replace("\0", " ") for line in lines]


def _unbroken(words: str) -> str:
    return words.replace(" ", "\0")


def todos_in(comments: Sequence[str | None]) -> set[str]:
    """The TODOs (as :func:`todo_text` spells them) that consecutive comment lines hold; None stands for a line
    without a comment, which ends a wrapped TODO."""
    return {text for _, _, text in _spans(comments)}


def todo_comments_in(source: str) -> list[str]:
    """Every TODO comment of the Python ``source`` as one line, its wrapped lines joined: what a reader of a migrated
    file (a test, a tool) compares with the report."""
    own_lines: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and token.line.strip() == token.string.strip():
            own_lines[token.start[0]] = token.string.strip()
    comments = [own_lines.get(number) for number in range(1, max(own_lines, default=0) + 1)]
    longest: dict[int, str] = {}
    for start, _, text in _spans(comments):
        longest[start] = text
    return list(longest.values())


def with_todo_comments(statement: cst.CSTNodeT, comments: Sequence[str]) -> tuple[cst.CSTNodeT, int]:
    """``statement`` with each of ``comments`` (:func:`todo_text` texts) written above it, unless already there;
    (node, comments added).

    ``statement`` is a simple statement line or a compound statement (their ``leading_lines`` precede decorators).
    """
    leading: Sequence[cst.EmptyLine] = getattr(statement, "leading_lines", ())
    present = {todo_identity(text) for text in todos_in(_comment_values(leading))}
    new = [text for text in _unique(comments) if todo_identity(text) not in present]
    if not new:
        return statement, 0
    written = (cst.EmptyLine(comment=cst.Comment(line)) for text in new for line in todo_lines(text))
    return statement.with_changes(leading_lines=[*leading, *written]), len(new)


def without_todos(lines: Sequence[cst.EmptyLine], texts: Collection[str]) -> tuple[list[cst.EmptyLine], int]:
    """``lines`` less each TODO comment (all of its lines) that is one of ``texts`` (by :func:`todo_identity`); and how
    many TODOs went."""
    identities = {todo_identity(text) for text in texts}
    dropped: set[int] = set()
    starts: set[int] = set()
    for start, end, text in _spans(_comment_values(lines)):
        if todo_identity(text) in identities and _is_whole(text) and start not in starts:
            starts.add(start)
            dropped.update(range(start, end))
    return [line for index, line in enumerate(lines) if index not in dropped], len(starts)


def _spans(comments: Sequence[str | None]) -> Iterator[tuple[int, int, str]]:
    """``(first, last + 1, text)`` of every TODO in ``comments``: a marker line, and each run of continuation lines
    after it joined to it. Every shorter run is one too, so a comment of the user's own that follows a TODO and
    happens to start like a continuation does not hide the TODO."""
    for start, value in enumerate(comments):
        if value is None or not value.startswith(TODO_MARKER):
            continue
        text, end = value, start + 1
        yield start, end, text
        while end < len(comments) and _is_continuation(comments[end]):
            text = f"{text} {str(comments[end])[len(CONTINUATION) :].strip()}"
            end += 1
            yield start, end, text


_WHOLE = re.compile(r" — see (cudagraph-migrate --explain CG\d+|migration-guide\.md#[a-z0-9-]+)$")
"""How a complete TODO ends: this version's command, or an earlier version's guide anchor."""


def _is_whole(text: str) -> bool:
    return bool(_WHOLE.search(text))


def _is_continuation(value: str | None) -> bool:
    return value is not None and value.startswith(CONTINUATION) and bool(value[len(CONTINUATION) :].strip())


def _comment_values(lines: Iterable[cst.EmptyLine]) -> list[str | None]:
    return [line.comment.value if line.comment is not None else None for line in lines]


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
