"""CG301: renamed enum members (``Backend.TCPIECEWISE`` -> ``Backend.TC_PIECEWISE``), driven by ``enum_member`` rows.

Matched by attribute spelling: the member names are distinctive and the enum is reached through many aliases.
"""

from __future__ import annotations

import libcst as cst

from ..renames import RenameKind, RenameTable
from .base import MigrationCommand


class LegacyEnumMembers(MigrationCommand):
    """Rename legacy enum members at every attribute access."""

    @classmethod
    def triggers(cls, table: RenameTable) -> frozenset[str]:
        """Text that must occur in a file for this rule to have anything to do."""
        return frozenset(row.old for row in table.of_kind(RenameKind.ENUM_MEMBER))

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """Load the rows, then rewrite."""
        self.renames = {row.old: row.new for row in self.table.of_kind(RenameKind.ENUM_MEMBER)}
        return super().transform_module_impl(tree)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        """``X.TCPIECEWISE`` -> ``X.TC_PIECEWISE``."""
        new = self.renames.get(updated_node.attr.value)
        if new is None:
            return updated_node
        self.edited()
        return updated_node.with_changes(attr=updated_node.attr.with_changes(value=new))
