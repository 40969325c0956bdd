"""CG302: legacy spellings of config values (``"tcpcg"`` -> ``"tc_piecewise"``), driven by ``config_string`` rows.

Only a string literal that is exactly a legacy value is rewritten (an argument, a list element, a dict value, a
comparison); the values are distinctive tokens that never occur as ordinary words.
"""

from __future__ import annotations

import libcst as cst

from ..renames import RenameKind, RenameTable
from .base import MigrationCommand, string_value, with_string_value


class LegacyConfigStrings(MigrationCommand):
    """Rewrite legacy config value strings."""

    @classmethod
    def triggers(cls, table: RenameTable) -> frozenset[str]:
        """Text that must occur in a file for this rule to have anything to do."""
        return frozenset(row.old for row in table.of_kind(RenameKind.CONFIG_STRING))

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """Load the rows, then rewrite."""
        self.renames = {row.old: row.new for row in self.table.of_kind(RenameKind.CONFIG_STRING)}
        return super().transform_module_impl(tree)

    def leave_SimpleString(self, original_node: cst.SimpleString, updated_node: cst.SimpleString) -> cst.SimpleString:
        """``"tcpiecewise"`` -> ``"tc_piecewise"``."""
        value = string_value(updated_node)
        if value is None or value not in self.renames:
            return updated_node
        self.edited()
        return with_string_value(updated_node, self.renames[value])
