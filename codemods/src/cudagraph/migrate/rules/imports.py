"""CG101: imports of legacy modules and symbols, and every reference that goes through them.

Driven by the ``module`` and ``symbol`` rows and the exports manifest. Names are followed through libcst's scope
analysis, so only bindings that really came from a legacy module change: an engine's own ``ForwardContext`` from its
own module is left alone. A name moves only where it will resolve: it has a ``symbol`` row, or the new module exports
it; every other name stays imported from the legacy module, in a statement of its own, and is reported.

- ``from legacy import a, b as c``: one ``from new import ...`` per destination module (split), and names from several
  legacy imports of one block that land in the same module share one statement (merged). The user's alias is kept;
  an unaliased renamed name is renamed at every use (plain and in string annotations, and in ``__all__``), unless the
  new name is already taken in that scope, in which case the import keeps the old local name as an alias.
- ``import legacy as m`` / ``from pkg import legacy as m``: ``import new as m``; ``m.Old`` becomes ``m.New``, or the
  full new dotted path (plus its import) when the name moved to another module. Where ``m`` is also used for a name
  that does not move (or on its own), the legacy import stays; the names that move are rewritten to their full new
  paths and the rest are reported.
- ``import legacy``: ``import new`` and ``legacy.Old`` becomes ``new.module.New`` (same rule for names that stay).
- Relative imports are resolved against the file's path (see ``LegacyModuleMatcher``).

What each statement becomes is decided in one walk before anything changes (``import_plan.ImportPlanner``: merges
need the whole module); this module holds the rule and applies the plan.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from pathlib import PurePath

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import ScopeProvider

from ..compat import ApiChecker
from ..handoffs import HandoffChecker
from ..legacy_api import load_legacy_api
from ..metadata import parents
from ..reexports import import_statements
from ..renames import Rename, RenameTable
from ..todo_comments import GuideSection
from .base import (
    Finding,
    LegacyModuleMatcher,
    MigrationCommand,
    QuickView,
    dotted_expression,
    dotted_name,
    original_source,
)
from .import_plan import ImportPlanner, StatementPlan


class LegacyImports(MigrationCommand):
    """Rewrite imports of legacy modules and symbols to their new homes, following every use of the bindings."""

    METADATA_DEPENDENCIES = (ScopeProvider,)

    @classmethod
    def triggers(cls, table: RenameTable) -> frozenset[str]:
        """Every legacy module path (absolute imports name it in full)."""
        return frozenset(table.modules)

    @classmethod
    def applies(cls, text: str, path: str, table: RenameTable, markers: frozenset[str] = frozenset()) -> bool:
        """A legacy module path in full, or (for relative imports) its last part in a file under its top package.

        A relative import can only reach ``sglang.srt.model_executor.cuda_graph_runner`` from a file inside a
        directory named ``sglang`` (a vendored copy included), so the short name is looked for only there.
        """
        if any(module in text for module in table.modules):
            return True
        if any(_parent(module) in text and module.rpartition(".")[2] in text for module in table.modules):
            return True  # from package import legacy_module
        directories = set(PurePath(path).parent.parts)
        return any(
            module.partition(".")[0] in directories and module.rpartition(".")[2] in text for module in table.modules
        )

    @classmethod
    def prefilter_texts(cls, table: RenameTable) -> frozenset[str]:
        """The last part of every legacy module: each way :meth:`applies` keeps a file holds one."""
        return frozenset(module.rpartition(".")[2] for module in table.modules)

    @classmethod
    def quick_findings(cls, view: QuickView) -> list[Finding] | None:
        """Nothing to do (no libcst work) where no import statement names a legacy module."""
        matcher = LegacyModuleMatcher(view.table, view.path)
        for node in import_statements(view.tree):
            if isinstance(node, ast.Import) and any(matcher.match(alias.name) for alias in node.names):
                return None
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if (module or node.level) and matcher.match(module, level=node.level):
                    return None
                if any(
                    matcher.match(f"{module}.{alias.name}" if module else alias.name, level=node.level)
                    for alias in node.names
                ):
                    return None
        return []

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """Plan every import rewrite over the whole module first (merges need it), then apply the plan."""
        legacy_matcher = LegacyModuleMatcher(self.table, self.context.filename)
        self.matcher = legacy_matcher.for_file(*original_source(self.context, tree))
        for node, module in self.matcher.current_api_imports:
            self.skip(
                node,
                f"{module}: the legacy engine still ships this module and this file imports no retired legacy "
                "module, so it is taken as that engine's current API",
            )
        self.checker = ApiChecker(self.table, self.exports, load_legacy_api())
        self.handoffs = HandoffChecker(self.checker)
        self.refused_accesses: set[int] = set()
        """Module-binding accesses (``m`` of ``m.Name``) whose ``Name`` the new API does not accept here."""
        self.statement_plans: dict[int, StatementPlan] = {}
        self.renamed_names: dict[int, str] = {}
        self.renamed_strings: dict[int, dict[str, str]] = {}
        self.module_level_renames: dict[str, str] = {}
        self.module_uses: dict[int, tuple[Rename, bool, bool]] = {}
        """Access node of a legacy module binding -> (module row, bound through an alias, legacy import kept)."""
        self._parents: Mapping[cst.CSTNode, cst.CSTNode] | None = None
        self._on_the_way: set[int] = set()
        planner = ImportPlanner(self)
        tree.visit(planner)
        planner.finish()
        if not self.statement_plans and not self.module_uses and not self.has_planned_comments:
            return tree
        self._on_the_way = self._ways_to_rewrites(tree)
        return tree.visit(self)

    def on_visit(self, node: cst.CSTNode) -> bool:
        """Go down only towards a node the plan rewrites or marks: the rest of the tree stays as it is (the same node
        objects), and a visit of it would rebuild every node for nothing."""
        return super().on_visit(node) and id(node) in self._on_the_way

    def _ways_to_rewrites(self, tree: cst.Module) -> set[int]:
        """Ids of the nodes on the way from ``tree`` down to every node the plan rewrites or marks with a TODO (an
        ``__all__`` assignment being one while module-level names are renamed), those nodes included."""
        targets = {
            *self.statement_plans,
            *self.renamed_names,
            *self.renamed_strings,
            *self.module_uses,
            *self.planned_comment_ids,
        }
        assignments = (cst.Assign, cst.AugAssign) if self.module_level_renames else ()
        parent_of = self._parent_map()
        on_the_way = {id(tree)}
        for node in parent_of:
            if id(node) not in targets and type(node) not in assignments:
                continue
            while id(node) not in on_the_way:
                on_the_way.add(id(node))
                node = parent_of[node]
        return on_the_way

    # --- applying the plan -------------------------------------------------------------------------------------

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement] | cst.RemovalSentinel:
        """Replace a line holding legacy imports with the planned statements, keeping its comments."""
        plans = [self.statement_plans.get(id(small)) for small in original_node.body]
        if not any(plan is not None for plan in plans):
            return updated_node
        lines: list[cst.SimpleStatementLine] = []
        for small, plan in zip(updated_node.body, plans, strict=True):
            if plan is None:
                lines.append(cst.SimpleStatementLine(body=[small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)]))
                continue
            self.edited()
            lines.extend(_parse_line(code) for code in plan.statements)
        if not lines:
            return cst.RemoveFromParent()
        lines[0] = lines[0].with_changes(leading_lines=original_node.leading_lines)
        lines[-1] = lines[-1].with_changes(trailing_whitespace=original_node.trailing_whitespace)
        return cst.FlattenSentinel(lines)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        """Rename a use of a binding whose imported name changed."""
        new_name = self.renamed_names.get(id(original_node))
        if new_name is None:
            return updated_node
        self.edited()
        return updated_node.with_changes(value=new_name)

    def leave_SimpleString(self, original_node: cst.SimpleString, updated_node: cst.SimpleString) -> cst.SimpleString:
        """Rename bindings inside a string annotation."""
        renames = self.renamed_strings.get(id(original_node))
        if not renames:
            return updated_node
        value = updated_node.value
        for old, new in renames.items():
            value = re.sub(rf"(?<![\w.]){re.escape(old)}(?!\w)", new, value)
        if value != updated_node.value:
            self.edited()
        return updated_node.with_changes(value=value)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute | cst.Name:
        """``m.Old`` through a legacy module binding becomes ``m.New`` or the full new path."""
        use = self.module_uses.get(id(original_node.value))
        if use is None or id(original_node.value) in self.refused_accesses:
            return updated_node
        module_row, through_alias, import_kept = use
        target = self.command_target(module_row, original_node.attr.value)
        if target is None:
            self.note(
                original_node,
                f"{module_row.old}.{original_node.attr.value}: {module_row.new} has no such name; left as written",
                GuideSection.NAMES_THAT_STAY,
            )
            return updated_node
        new_module, new_name = target
        self.edited()
        if through_alias and not import_kept and new_module == module_row.new:
            return updated_node.with_changes(attr=cst.Name(new_name))
        AddImportsVisitor.add_needed_import(self.context, new_module)
        return dotted_expression(f"{new_module}.{new_name}")

    def parent_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The parent of ``node``."""
        return self.parent_map().get(node)

    def parent_map(self) -> Mapping[cst.CSTNode, cst.CSTNode]:
        """Every node's parent (computed once per run)."""
        if self._parents is None:
            self._parents = self._parent_map()
        return self._parents

    def _parent_map(self) -> Mapping[cst.CSTNode, cst.CSTNode]:
        wrapper = self.context.wrapper
        assert wrapper is not None
        return parents(wrapper)

    def command_target(self, module_row: Rename, name: str) -> tuple[str, str] | None:
        """Where ``name`` of the legacy module ``module_row`` lives now: a symbol row, or exported unchanged."""
        symbol = self.table.symbol(module_row.old, name)
        if symbol is not None:
            return symbol.new_module, symbol.new_name
        if self.exports.exports(module_row.new, name):
            return module_row.new, name
        return None

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        """Keep ``__all__`` in step with renamed module-level bindings."""
        if any(dotted_name(target.target) == "__all__" for target in updated_node.targets):
            return updated_node.with_changes(value=self._rename_all(updated_node.value))
        return updated_node

    def leave_AugAssign(self, original_node: cst.AugAssign, updated_node: cst.AugAssign) -> cst.AugAssign:
        """``__all__ += [...]`` too."""
        if dotted_name(updated_node.target) == "__all__":
            return updated_node.with_changes(value=self._rename_all(updated_node.value))
        return updated_node

    def _rename_all(self, value: cst.BaseExpression) -> cst.BaseExpression:
        if not self.module_level_renames or not isinstance(value, (cst.List, cst.Tuple, cst.Set)):
            return value
        elements = []
        for element in value.elements:
            item = element.value
            if isinstance(item, cst.SimpleString) and item.evaluated_value in self.module_level_renames:
                quote = item.quote
                new_value = self.module_level_renames[str(item.evaluated_value)]
                item = item.with_changes(value=f"{item.prefix}{quote}{new_value}{quote}")
                self.edited()
            elements.append(element.with_changes(value=item))
        return value.with_changes(elements=elements)


def _parse_line(code: str) -> cst.SimpleStatementLine:
    statement = cst.parse_statement(code)
    assert isinstance(statement, cst.SimpleStatementLine)
    return statement


def _parent(module: str) -> str:
    return module.rpartition(".")[0] or module
