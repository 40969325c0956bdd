"""CG302: legacy spellings of config values (``"tcpcg"`` -> ``"tc_piecewise"``), driven by ``config_string`` rows.

Only a string literal that is exactly a legacy value *and* sits inside the arguments of a call of one of the row's
owners (``resolve(prefill_cuda_graph_backend="tcpcg")``, ``Backend("tcpiecewise")``) is rewritten: elsewhere the
string may be another program's value, and ``cudagraph.config`` still accepts the legacy spellings at run time (with
one deprecation warning). Inside a list, tuple or set, a rewritten value that is already present is dropped rather
than written twice.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from ..renames import RenameKind, RenameTable
from .base import Finding, MigrationCommand, QuickView, string_value, with_string_value
from .owners import OWNER_METADATA, OwnerResolver, canonicalizer_for, owner_rows
from .same_spelled import config_string_findings, config_string_message


class LegacyConfigStrings(MigrationCommand):
    """Rewrite legacy config value strings passed to the legacy API."""

    METADATA_DEPENDENCIES = OWNER_METADATA
    TIED_TO_OWNERS = True

    @classmethod
    def owners_by_trigger(cls, table: RenameTable) -> dict[str, tuple[str, ...]]:
        """Each row's trigger text and its owners."""
        return {row.old: row.owners for row in table.of_kind(RenameKind.CONFIG_STRING)}

    @classmethod
    def same_spelled(cls, view: QuickView) -> list[Finding]:
        """Every legacy config value of a file that reaches no owner, read off the :mod:`ast` tree."""
        return config_string_findings(view.tree, view.table, cls.CODE)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """Load the rows, then rewrite."""
        self.rows = owner_rows(self.table, RenameKind.CONFIG_STRING)
        self.owners = OwnerResolver(self, canonicalizer_for(self))
        self.owner_calls: list[frozenset[str]] = []
        self.rewritten: set[int] = set()
        return super().transform_module_impl(tree)

    def visit_Call(self, node: cst.Call) -> None:
        """Remember which owners the arguments below are passed to."""
        self.owner_calls.append(self.owners.class_types(node.func))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        """Leave the call."""
        self.owner_calls.pop()
        return updated_node

    def leave_SimpleString(self, original_node: cst.SimpleString, updated_node: cst.SimpleString) -> cst.SimpleString:
        """``"tcpiecewise"`` -> ``"tc_piecewise"`` inside an owner's arguments."""
        value = string_value(updated_node)
        row = self.rows.get(value) if value is not None else None
        if row is None:
            return updated_node
        new, owners = row
        if not any(callee & frozenset(owners) for callee in self.owner_calls):
            self.skip(original_node, config_string_message(str(value), owners))
            return updated_node
        self.edited()
        rewritten = with_string_value(updated_node, new)
        self.rewritten.add(id(rewritten))
        return rewritten

    def leave_List(self, original_node: cst.List, updated_node: cst.List) -> cst.List:
        """Drop a value the rewrite made a duplicate of."""
        return updated_node.with_changes(elements=_without_duplicates(updated_node.elements, self.rewritten))

    def leave_Tuple(self, original_node: cst.Tuple, updated_node: cst.Tuple) -> cst.Tuple:
        """Drop a value the rewrite made a duplicate of."""
        return updated_node.with_changes(elements=_without_duplicates(updated_node.elements, self.rewritten))

    def leave_Set(self, original_node: cst.Set, updated_node: cst.Set) -> cst.Set:
        """Drop a value the rewrite made a duplicate of."""
        return updated_node.with_changes(elements=_without_duplicates(updated_node.elements, self.rewritten))


def _without_duplicates(after: Sequence[cst.BaseElement], rewritten: set[int]) -> Sequence[cst.BaseElement]:
    """``after`` minus string elements that this rule rewrote into a value already present earlier."""
    seen: set[str] = set()
    kept: list[cst.BaseElement] = []
    for new in after:
        value = string_value(new.value) if isinstance(new, cst.Element) else None
        if id(new.value) in rewritten and value in seen:
            continue
        if value is not None:
            seen.add(value)
        kept.append(new)
    if len(kept) == len(after):
        return after
    if kept and not isinstance(after[-1].comma, cst.Comma):
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return kept
