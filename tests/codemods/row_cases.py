"""Generated cases for the per-row renames: every ``module`` row of the rename table, in each import form.

For each legacy module the source imports every name its ``symbol`` rows move, one name the new module exports
unchanged (found in the exports manifest) and, in some forms, one name that does not move at all. The expected output
is spelled from the rows' ``new`` fields by string formatting, never by running the codemod, so these cases can fail;
the layout follows what ``cudagraph.migrate.rules.imports`` documents (names that stay come first in a statement of
their own, one ``from new import ...`` per destination module in order of first appearance, an ``import`` added for
a name reached through a module binding that moved to another module). What a row cannot spell (comments, relative
imports, clashes with names already bound) stays a hand-written pair under ``fixtures/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from cudagraph.migrate.exports import ExportsManifest, load_exports
from cudagraph.migrate.options import RunOptions
from cudagraph.migrate.renames import Rename, RenameKind, RenameTable, load_renames
from cudagraph.migrate.rules import select_rules
from cudagraph.migrate.source_migration import SourceMigration, migrate_source
from cudagraph.migrate.todo_comments import todo_lines, todo_text

STAYING_NAME = "_legacy_only_helper"
"""A name of a legacy module that nothing moves: no row names it and no new module exports it."""

BINDING = "legacy"
"""The local name a legacy module is bound to in the module-binding forms."""

ALIAS_PREFIX = "legacy_"
"""Aliased imports bind ``legacy_<old name>``, which no row's new name spells, so the codemod keeps every alias."""


@dataclass(frozen=True)
class RowCase:
    """One generated source for one legacy module, and what migrating it must give."""

    form: str
    """How the legacy module is imported (``from_import``, ``module_alias``, ...; see ``_cases_of``)."""
    module_row: Rename
    source: str
    expected: str
    notes: tuple[str, ...] = ()
    """The notes the migration reports, as ``str(finding)``."""

    @property
    def name(self) -> str:
        """``<form>_<legacy module with underscores>``, the test id."""
        return f"{self.form}_{self.module_row.old.replace('.', '_')}"

    @property
    def virtual_path(self) -> str:
        """The path the source is migrated as (no legacy package directory, so only absolute imports match)."""
        return f"generated/{self.name}.py"

    def migrate(self, text: str) -> SourceMigration:
        """Migrate ``text`` with every rule, as the fixture pairs are."""
        # Every row moves here, state shared with a legacy runner included (fixtures/shared_state_stays.* shows the
        # default, where those names stay until the runner moves).
        options = RunOptions(move_shared_state=True)
        return migrate_source(text, self.virtual_path, select_rules([]), load_renames(), options)


@dataclass(frozen=True)
class _Move:
    """One name of a legacy module and where it lands."""

    old_name: str
    new_module: str
    new_name: str


def row_cases(table: RenameTable | None = None, exports: ExportsManifest | None = None) -> list[RowCase]:
    """Every generated case: each ``module`` row of ``table`` in each form."""
    table = table or load_renames()
    exports = exports or load_exports()
    _check_staying_name(table, exports)
    # a module the legacy engine still ships is legacy only beside a retired one: fixtures/eagle_draft_runners*.py
    modules = [row for row in table.of_kind(RenameKind.MODULE) if not row.still_shipped]
    return [case for row in modules for case in _cases_of(row, table, exports)]


def _check_staying_name(table: RenameTable, exports: ExportsManifest) -> None:
    named = {row.old_name for row in table.of_kind(RenameKind.SYMBOL)}
    if STAYING_NAME in named or any(exports.exports(module, STAYING_NAME) for module in exports.modules):
        raise ValueError(f"{STAYING_NAME} now moves; pick another name for the cases where a name stays")


def _moves_of(row: Rename, table: RenameTable, exports: ExportsManifest) -> list[_Move]:
    """The symbol rows of ``row``'s module in table order, then one name the new module exports unchanged."""
    symbols = table.symbols_of(row.old)
    moves = [_Move(symbol.old_name, symbol.new_module, symbol.new_name) for symbol in symbols]
    spelled = {move.old_name for move in moves} | {move.new_name for move in moves}
    unchanged = sorted(exports.modules.get(row.new, frozenset()) - spelled)
    if unchanged:
        moves.append(_Move(unchanged[0], row.new, unchanged[0]))
    old_names = {move.old_name for move in moves}
    clashing = [move for move in moves if move.new_name != move.old_name and move.new_name in old_names]
    if clashing:
        # the new name is already bound by another legacy import, so the codemod keeps an alias: hand-write that case
        raise ValueError(f"{row.old}: {clashing[0].old_name} -> {clashing[0].new_name} clashes with a legacy name")
    return moves


def _cases_of(row: Rename, table: RenameTable, exports: ExportsManifest) -> Iterator[RowCase]:
    moves = _moves_of(row, table, exports)
    parent, _, last = row.old.rpartition(".")
    module_alias = f"import {row.old} as {BINDING}"
    parent_import_alias = f"from {parent} import {last} as {BINDING}"
    forms = {
        "from_import": _from_import(row, moves, aliased=False, multiline=True, staying=False),
        "from_import_aliased": _from_import(row, moves, aliased=True, multiline=False, staying=False),
        "from_import_staying": _from_import(row, moves, aliased=False, multiline=True, staying=True),
        "module_alias": _module_binding(row, moves, module_alias, staying=False),
        "parent_import_alias": _module_binding(row, moves, parent_import_alias, staying=False),
        "module_alias_staying": _module_binding(row, moves, module_alias, staying=True),
    }
    for form, (source, expected, notes) in forms.items():
        yield RowCase(form, row, source, expected, notes)


def _file(docstring: str, imports: list[str], uses: list[str], todo_above_uses: str | None = None) -> str:
    # each name is only tested, never handed on: a name handed on is checked against its construction contract,
    # which fixtures/handoff_values.* covers
    elements = "".join(f"        {use} is not None,\n" for use in uses)
    todo = "".join(f"    {line}\n" for line in todo_lines(todo_above_uses)) if todo_above_uses else ""
    return f'"""{docstring}"""\n\n' + "".join(imports) + f"\n\ndef use_all():\n{todo}    return [\n{elements}    ]\n"


def _from_statement(module: str, spelled: list[str], *, multiline: bool) -> str:
    if multiline:
        return f"from {module} import (\n" + "".join(f"    {name},\n" for name in spelled) + ")\n"
    return f"from {module} import {', '.join(spelled)}\n"


def _from_import(
    row: Rename, moves: list[_Move], *, aliased: bool, multiline: bool, staying: bool
) -> tuple[str, str, tuple[str, ...]]:
    """``from legacy import ...``: unaliased names are renamed at their uses, aliases are kept."""
    docstring = f"Every symbol row of {row.old}, imported by name{' under an alias' if aliased else ''} and used."
    alias = {move.old_name: f"{ALIAS_PREFIX}{move.old_name}" if aliased else None for move in moves}
    legacy_spelled = [f"{move.old_name} as {alias[move.old_name]}" if aliased else move.old_name for move in moves]
    legacy_uses = [alias[move.old_name] or move.old_name for move in moves]
    migrated_uses = [alias[move.old_name] or move.new_name for move in moves]
    by_module: dict[str, list[str]] = {}
    for move in moves:
        spelled = f"{move.new_name} as {alias[move.old_name]}" if aliased else move.new_name
        names = by_module.setdefault(move.new_module, [])
        if spelled not in names:  # two legacy names that became one new name are imported once
            names.append(spelled)
    expected_imports = [_from_statement(module, names, multiline=multiline) for module, names in by_module.items()]
    if staying:
        legacy_spelled.insert(0, STAYING_NAME)
        legacy_uses.insert(0, STAYING_NAME)
        migrated_uses.insert(0, STAYING_NAME)
        reason = f"not exported by {row.new} and not in the rename table; kept on {row.old}"
        todo = todo_text(f"{STAYING_NAME}: {reason}", "CG101")
        written = "".join(f"{line}\n" for line in todo_lines(todo))
        expected_imports.insert(0, written + _from_statement(row.old, [STAYING_NAME], multiline=multiline))
    legacy_import = _from_statement(row.old, legacy_spelled, multiline=multiline)
    source = _file(docstring, [legacy_import], legacy_uses)
    notes: tuple[str, ...] = ()
    if staying:
        line = source.splitlines().index(legacy_import.splitlines()[0]) + 1
        reason = f"not exported by {row.new} and not in the rename table; kept on {row.old}"
        notes = (f"CG101 {line}: {STAYING_NAME}: {reason}",)
    return source, _file(docstring, expected_imports, migrated_uses), notes


def _module_binding(
    row: Rename, moves: list[_Move], legacy_import: str, *, staying: bool
) -> tuple[str, str, tuple[str, ...]]:
    """A legacy module bound to ``legacy``: ``legacy.Old`` becomes ``legacy.New`` where the name stays in the new
    module and the full new path where it moved to another one; a use of a name that does not move keeps the legacy
    import, and then every name that moves is spelled with its full new path."""
    docstring = f"Every symbol row of {row.old}, reached through a module binding."
    legacy_uses = [f"{BINDING}.{move.old_name}" for move in moves]
    if staying:
        migrated_uses = [f"{move.new_module}.{move.new_name}" for move in moves]
        imported = sorted({move.new_module for move in moves})
        expected_imports = [f"{legacy_import}\n", *(f"import {module}\n" for module in imported)]
    else:
        migrated_uses = [
            f"{BINDING if move.new_module == row.new else move.new_module}.{move.new_name}" for move in moves
        ]
        imported = sorted({move.new_module for move in moves} - {row.new})
        expected_imports = [f"import {row.new} as {BINDING}\n", *(f"import {module}\n" for module in imported)]
    if staying:
        legacy_uses.insert(0, f"{BINDING}.{STAYING_NAME}")
        migrated_uses.insert(0, f"{BINDING}.{STAYING_NAME}")
    source = _file(docstring, [f"{legacy_import}\n"], legacy_uses)
    notes: tuple[str, ...] = ()
    todo = None
    if staying:
        line = source.splitlines().index(f"        {BINDING}.{STAYING_NAME} is not None,") + 1
        message = f"{row.old}.{STAYING_NAME}: {row.new} has no such name; left as written"
        notes = (f"CG101 {line}: {message}",)
        todo = todo_text(message, "CG101")
    return source, _file(docstring, expected_imports, migrated_uses, todo), notes
