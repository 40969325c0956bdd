"""CG102: dotted paths inside strings (``mock.patch("legacy.module.Name")``, ``importlib.import_module(...)``).

Driven by the ``module`` and ``symbol`` rows and the exports manifest. Only a whole string that is exactly a dotted
path starting at a legacy module is rewritten, and only when its name moves (a symbol row, or exported by the new
module); a path to a name that stays is reported. Prose is never touched. A member after the name (a method patched
on a class) is renamed only when that class is one of the member row's owners.
"""

from __future__ import annotations

import re

import libcst as cst

from ..renames import RenameKind, RenameTable
from .base import LegacyModuleMatcher, MigrationCommand, string_value, with_string_value
from .owners import owner_rows

_DOTTED_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


class LegacyDottedStrings(MigrationCommand):
    """Rewrite string literals that spell a legacy dotted path to the new path."""

    @classmethod
    def triggers(cls, table: RenameTable) -> frozenset[str]:
        """Text that must occur in a file for this rule to have anything to do: a legacy path opening a string."""
        return frozenset(f"{quote}{module}" for module in table.modules for quote in "\"'")

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """Set up the matcher (absolute paths only: a string has no package to be relative to)."""
        self.matcher = LegacyModuleMatcher(self.table, None)
        self.members = owner_rows(self.table, RenameKind.ATTRIBUTE, RenameKind.METHOD)
        return super().transform_module_impl(tree)

    def leave_SimpleString(self, original_node: cst.SimpleString, updated_node: cst.SimpleString) -> cst.SimpleString:
        """``"legacy.mod.Old.method"`` -> ``"new.mod.New.new_method"``."""
        value = string_value(updated_node)
        if value is None or not _DOTTED_PATH.fullmatch(value):
            return updated_node
        match = self.matcher.match(value)
        if match is None:
            return updated_node
        if not match.rest:
            new_path = match.row.new
        else:
            symbol = self.table.symbol(match.row.old, match.rest[0])
            if symbol is not None:
                head = symbol.new
            elif self.exports.exports(match.row.new, match.rest[0]):
                head = f"{match.row.new}.{match.rest[0]}"
            else:
                self.note(original_node, f"{value}: {match.row.new} has no {match.rest[0]}; left as written")
                return updated_node
            new_path = ".".join([head, *self._members(head, match.rest[1:])])
        self.edited()
        return with_string_value(updated_node, new_path)

    def _members(self, owner: str, parts: tuple[str, ...]) -> list[str]:
        """``parts`` after the class ``owner``: the first is renamed when ``owner`` owns that member."""
        if not parts:
            return []
        row = self.members.get(parts[0])
        first = row[0] if row is not None and owner in row[1] else parts[0]
        return [first, *parts[1:]]
