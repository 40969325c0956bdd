"""CG402: legacy command-line flags inside argument lists (``["--cuda-graph-bs", "8"]``), driven by ``cli_flag`` rows.

Only elements of list, tuple and set literals are rewritten (that is where argv is spelled), so a legacy parser's own
``add_argument("--cuda-graph-bs")`` is left alone. A boolean switch that became a valued option expands to two
elements (``"--enable-breakable-cuda-graph"`` -> ``"--prefill-cuda-graph-backend", "breakable"``), a switch that
became one per phase to one element per phase, and ``"--old=value"`` keeps its value.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from ..renames import Rename, RenameKind, RenameTable
from .base import MigrationCommand, splice, string_value, with_string_value


class LegacyCliFlags(MigrationCommand):
    """Rewrite legacy flags in argument-list literals."""

    @classmethod
    def triggers(cls, table: RenameTable) -> frozenset[str]:
        """Text that must occur in a file for this rule to have anything to do."""
        return frozenset(row.old for row in table.of_kind(RenameKind.CLI_FLAG))

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """Load the rows, then rewrite."""
        self.rows = self.table.by_old(RenameKind.CLI_FLAG)
        return super().transform_module_impl(tree)

    def leave_List(self, original_node: cst.List, updated_node: cst.List) -> cst.List:
        """Argument lists."""
        return updated_node.with_changes(elements=self._rewrite(updated_node.elements))

    def leave_Tuple(self, original_node: cst.Tuple, updated_node: cst.Tuple) -> cst.Tuple:
        """Argument tuples."""
        return updated_node.with_changes(elements=self._rewrite(updated_node.elements))

    def leave_Set(self, original_node: cst.Set, updated_node: cst.Set) -> cst.Set:
        """Flag sets."""
        return updated_node.with_changes(elements=self._rewrite(updated_node.elements))

    def _rewrite(self, elements: Sequence[cst.BaseElement]) -> list[cst.BaseElement]:
        replacements: dict[int, list[cst.BaseElement]] = {}
        for index, element in enumerate(elements):
            if not isinstance(element, cst.Element) or not isinstance(element.value, cst.SimpleString):
                continue
            new_elements = self._replacement(element, element.value)
            if new_elements is not None:
                replacements[index] = new_elements
                self.edited()
        return splice(list(elements), replacements) if replacements else list(elements)

    def _replacement(self, element: cst.Element, node: cst.SimpleString) -> list[cst.BaseElement] | None:
        text = string_value(node)
        if text is None:
            return None
        flag, equals, attached = text.partition("=")
        row: Rename | None = self.rows.get(flag)
        if row is None:
            return None
        if equals:
            if row.value is not None or row.also:
                return None  # a switch never carries "=value"; leave the odd spelling to the user
            return [element.with_changes(value=with_string_value(node, f"{row.new}={attached}"))]
        result: list[cst.BaseElement] = [
            element.with_changes(value=with_string_value(node, target)) for target in row.targets
        ]
        if row.value is not None:
            result.append(element.with_changes(value=with_string_value(node, row.value)))
        return result
