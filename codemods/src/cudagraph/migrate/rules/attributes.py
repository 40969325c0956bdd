"""CG201: renamed attributes and methods of the model runner and the graph runners.

Driven by the ``attribute`` and ``method`` rows. Rewrites attribute access (``runner.graph_runner``), method and
class-attribute definitions inside class bodies, and the name string of ``getattr``/``hasattr``/``setattr``/
``delattr``/``patch.object``/``monkeypatch.setattr``. These names are matched by spelling, not by type, since the
receiver's class is rarely knowable statically; a dotted chain that spells a legacy module path is left to CG101.
"""

from __future__ import annotations

import libcst as cst

from ..renames import RenameKind, RenameTable
from .base import MigrationCommand, dotted_name, string_value, with_string_value

_NAME_STRING_CALLS = frozenset({"getattr", "hasattr", "setattr", "delattr", "object"})
"""Calls whose second argument names an attribute (``object`` is ``mock.patch.object``)."""


class LegacyMembers(MigrationCommand):
    """Rename legacy attributes and methods wherever they are accessed or defined."""

    @classmethod
    def triggers(cls, table: RenameTable) -> frozenset[str]:
        """Text that must occur in a file for this rule to have anything to do."""
        return frozenset(row.old for row in table.of_kind(RenameKind.ATTRIBUTE, RenameKind.METHOD))

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """Load the rows, then rewrite."""
        self.renames = {row.old: row.new for row in self.table.of_kind(RenameKind.ATTRIBUTE, RenameKind.METHOD)}
        self.legacy_module_paths = frozenset(self.table.modules)
        self.enclosing: list[str] = []
        return super().transform_module_impl(tree)

    def visit_Import(self, node: cst.Import) -> bool:
        """Module paths in imports are CG101's."""
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        """Module paths in imports are CG101's."""
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        """Track that definitions below are class members."""
        self.enclosing.append("class")

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        """Leave the class."""
        self.enclosing.pop()
        return updated_node

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        """Track that definitions below are locals."""
        self.enclosing.append("function")

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        """Rename a method defined directly in a class body."""
        self.enclosing.pop()
        if self._in_class_body():
            return updated_node.with_changes(name=self._renamed(updated_node.name))
        return updated_node

    def leave_AnnAssign(self, original_node: cst.AnnAssign, updated_node: cst.AnnAssign) -> cst.AnnAssign:
        """Rename a class-level attribute declaration (``graph_runner: Runner | None = None``)."""
        if self._in_class_body() and isinstance(updated_node.target, cst.Name):
            return updated_node.with_changes(target=self._renamed(updated_node.target))
        return updated_node

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        """Rename a class-level attribute default (``graph_runner = None``)."""
        if not self._in_class_body():
            return updated_node
        targets = [
            target.with_changes(target=self._renamed(target.target)) if isinstance(target.target, cst.Name) else target
            for target in updated_node.targets
        ]
        return updated_node.with_changes(targets=targets)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        """``x.graph_runner`` -> ``x.decode_cuda_graph_runner`` (not inside a legacy module path)."""
        if updated_node.attr.value not in self.renames or self._spells_legacy_module(original_node):
            return updated_node
        return updated_node.with_changes(attr=self._renamed(updated_node.attr))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        """``getattr(runner, "graph_runner")`` and friends."""
        callee = dotted_name(updated_node.func)
        if callee is None or callee.rpartition(".")[2] not in _NAME_STRING_CALLS or len(updated_node.args) < 2:
            return updated_node
        name_arg = updated_node.args[1]
        name = string_value(name_arg.value)
        if name is None or name not in self.renames or not isinstance(name_arg.value, cst.SimpleString):
            return updated_node
        self.edited()
        new_arg = name_arg.with_changes(value=with_string_value(name_arg.value, self.renames[name]))
        return updated_node.with_changes(args=[updated_node.args[0], new_arg, *updated_node.args[2:]])

    def _in_class_body(self) -> bool:
        return bool(self.enclosing) and self.enclosing[-1] == "class"

    def _renamed(self, name: cst.Name) -> cst.Name:
        new = self.renames.get(name.value)
        if new is None:
            return name
        self.edited()
        return name.with_changes(value=new)

    def _spells_legacy_module(self, node: cst.Attribute) -> bool:
        dotted = dotted_name(node)
        return dotted is not None and any(
            path == dotted or path.startswith(dotted + ".") for path in self.legacy_module_paths
        )
