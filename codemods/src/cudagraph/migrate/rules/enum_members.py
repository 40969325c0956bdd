"""CG301: renamed enum members (``Backend.TCPIECEWISE`` -> ``Backend.TC_PIECEWISE``), driven by ``enum_member`` rows.

Only an attribute whose value :mod:`.owners` ties to the row's owner enum (``cudagraph.config.Backend``, also through
its legacy spellings) is renamed; another enum with a member of the same name is left alone.
"""

from __future__ import annotations

import libcst as cst

from ..renames import RenameKind, RenameTable
from .base import Finding, MigrationCommand, QuickView
from .owners import OWNER_METADATA, OwnerResolver, canonicalizer_for, owner_rows
from .same_spelled import enum_member_findings, enum_message


class LegacyEnumMembers(MigrationCommand):
    """Rename legacy enum members reached through the owner enum."""

    METADATA_DEPENDENCIES = OWNER_METADATA
    TIED_TO_OWNERS = True

    @classmethod
    def owners_by_trigger(cls, table: RenameTable) -> dict[str, tuple[str, ...]]:
        """Each row's trigger text and its owners."""
        return {row.old: row.owners for row in table.of_kind(RenameKind.ENUM_MEMBER)}

    @classmethod
    def same_spelled(cls, view: QuickView) -> list[Finding]:
        """Every ``X.OLD`` of a file that reaches no owner enum, read off the :mod:`ast` tree."""
        return enum_member_findings(view.tree, view.table, cls.CODE)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """Load the rows, then rewrite."""
        self.rows = owner_rows(self.table, RenameKind.ENUM_MEMBER)
        self.owners = OwnerResolver(self, canonicalizer_for(self))
        return super().transform_module_impl(tree)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        """``Backend.TCPIECEWISE`` -> ``Backend.TC_PIECEWISE``."""
        row = self.rows.get(updated_node.attr.value)
        if row is None:
            return updated_node
        new, owners = row
        if not self.owners.refers_to(original_node.value, owners):
            self.skip(original_node, enum_message(updated_node.attr.value, owners))
            return updated_node
        self.edited()
        return updated_node.with_changes(attr=updated_node.attr.with_changes(value=new))
