"""Migrate one file's source: parse once, run the selected rules in order, report edits per rule.

Pure function of (source, path, rules, table): no file I/O here, so tests, the CLI workers and the example share it.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass, field

import libcst as cst
from libcst.codemod import CodemodContext

from .renames import RenameTable
from .rules import Rule


class MigrationError(Exception):
    """The file could not be migrated (it does not parse, or a rule failed on it); it must be left untouched."""


@dataclass
class SourceMigration:
    """The outcome of migrating one source text."""

    original: bytes
    migrated: bytes
    edits: dict[str, int] = field(default_factory=dict)
    """Rewritten occurrences per rule code (rules with none are absent)."""
    notes: list[str] = field(default_factory=list)
    """Legacy uses left as written, each ``"CODE line: message"``."""

    @property
    def changed(self) -> bool:
        """Whether migration changed the text."""
        return self.migrated != self.original


def migrate_source(source: bytes | str, path: str, rules: Sequence[Rule], table: RenameTable) -> SourceMigration:
    """Run ``rules`` over ``source`` (the text of the file at ``path``; relative imports resolve against ``path``).

    Raises :class:`MigrationError` when the source does not parse or a rule fails; nothing is half-applied since the
    caller writes only a complete result.
    """
    original = source.encode("utf-8") if isinstance(source, str) else source
    text = original.decode("utf-8", errors="replace")
    active = [rule for rule in rules if any(trigger in text for trigger in rule.triggers(table))]
    if not active:
        # Nothing to rewrite, but a file that does not parse is still reported; the C parser checks it cheaply.
        _check_syntax(original, path)
        return SourceMigration(original, original)
    try:
        tree = cst.parse_module(original)
    except cst.ParserSyntaxError as error:
        _check_syntax(original, path)  # the C parser names the line more precisely where it also fails
        raise MigrationError(f"{path}:{error.raw_line}:{error.raw_column}: does not parse: {error.message}") from None
    result = SourceMigration(original, original)
    for rule in active:
        command = rule.command(CodemodContext(filename=path), table)
        try:
            tree = command.transform_module(tree)
        except Exception as error:  # a rule bug must fail this file, not the run
            raise MigrationError(f"{path}: rule {rule.code} failed: {type(error).__name__}: {error}") from error
        if command.edits:
            result.edits[rule.code] = command.edits
        result.notes.extend(f"{rule.code} {note}" for note in command.notes)
    result.migrated = tree.bytes
    return result


def _check_syntax(source: bytes, path: str) -> None:
    try:
        ast.parse(source, filename=path)
    except SyntaxError as error:
        raise MigrationError(f"{path}:{error.lineno}:{error.offset}: does not parse: {error.msg}") from None
