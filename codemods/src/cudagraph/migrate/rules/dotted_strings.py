"""CG102: dotted paths inside strings (``mock.patch("legacy.module.Name")``, ``importlib.import_module(...)``).

Driven by the ``module`` and ``symbol`` rows (and the attribute/method rows for parts after the symbol). Only a whole
string that is exactly a dotted path starting at a legacy module is rewritten; prose is never touched.
"""

from __future__ import annotations

import re

import libcst as cst

from ..renames import RenameKind, RenameTable
from .base import LegacyModuleMatcher, MigrationCommand, string_value, with_string_value

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
        self.member_renames = {row.old: row.new for row in self.table.of_kind(RenameKind.ATTRIBUTE, RenameKind.METHOD)}
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
            head = symbol.new if symbol is not None else f"{match.row.new}.{match.rest[0]}"
            members = [self.member_renames.get(part, part) for part in match.rest[1:]]
            new_path = ".".join([head, *members])
        self.edited()
        return with_string_value(updated_node, new_path)
