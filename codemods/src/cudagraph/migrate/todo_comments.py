"""The ``# TODO(cudagraph-migrate): ...`` comments that mark every place a migration could not move.

A rule that leaves legacy code as written (the new API lacks a member, a call would not bind, the class is not
ours) says so at the place, the way bump-pydantic writes ``# TODO[pydantic]``: one comment line above the statement,
naming what is missing and the section of the migration guide that says how to move it by hand. Comments are only
ever added, never removed, and an identical comment already above the statement is not written again, so a second
run changes nothing.

This module owns the wording and the placement; the rules decide where a comment is due (see
``MigrationCommand.note``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

import libcst as cst

__all__ = ["GUIDE", "TODO_MARKER", "GuideSection", "todo_text", "with_todo_comments"]

TODO_MARKER = "# TODO(cudagraph-migrate):"
"""How every comment starts (what ``grep`` and the tests look for)."""

GUIDE = "migration-guide.md"
"""The guide the comments point into (``refactor/migration-guide.md`` in the source tree)."""


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
    FLAG_DEFINITIONS = "flag-definitions"


def todo_text(message: str, section: GuideSection) -> str:
    """The comment for ``message`` (one line; the message must not contain a line break)."""
    one_line = " ".join(message.split())
    return f"{TODO_MARKER} {one_line} — see {GUIDE}#{section.value}"


def with_todo_comments(statement: cst.CSTNodeT, comments: Sequence[str]) -> tuple[cst.CSTNodeT, int]:
    """``statement`` with each of ``comments`` as a line above it, unless already there; (node, comments added).

    ``statement`` is a simple statement line or a compound statement (their ``leading_lines`` precede decorators).
    """
    leading: Sequence[cst.EmptyLine] = getattr(statement, "leading_lines", ())
    present = {line.comment.value for line in leading if line.comment is not None}
    new = [text for text in _unique(comments) if text not in present]
    if not new:
        return statement, 0
    lines = [*leading, *(cst.EmptyLine(comment=cst.Comment(text)) for text in new)]
    return statement.with_changes(leading_lines=lines), len(new)


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
