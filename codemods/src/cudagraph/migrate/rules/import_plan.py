"""CG101's plan: one walk over a module deciding what each legacy import statement becomes and which uses of its
bindings get renamed, written into the rule (``imports.LegacyImports``) that applies it.

The planner only decides: it fills the rule's tables (statement plans, renamed names and strings, module-binding
uses, refused accesses) and notes what stays and why; it never edits the tree. Names merge within one statement
list, so the walk keeps a ``_BlockMerge`` per block and writes the merged statements when it ``finish``es.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import BaseAssignment, ImportAssignment, Scope, ScopeProvider

from ..handoffs import UseKind, classify_use, enclosing_class, member_named
from ..renames import Rename
from ..todo_comments import GuideSection
from .base import MOVE_SHARED_STATE_KEY, dotted_name

if TYPE_CHECKING:  # only the annotation: the rule imports the planner, not the other way round
    from .imports import LegacyImports


@dataclass(frozen=True)
class ImportedName:
    """One name a rewritten ``from ... import`` brings in: the new name, the local alias (if any), a comment."""

    name: str
    alias: str | None
    comment: str | None = None


@dataclass
class StatementPlan:
    """What one legacy import statement becomes: statements in order (each a code string)."""

    statements: list[str] = field(default_factory=list)


@dataclass
class _BlockMerge:
    """Per block: the destination modules already placed, so later legacy imports in the block merge into them."""

    names_by_module: dict[str, list[ImportedName]] = field(default_factory=dict)
    owner_by_module: dict[str, int] = field(default_factory=dict)
    multiline_by_module: dict[str, bool] = field(default_factory=dict)
    existing: set[tuple[str, str, str | None]] = field(default_factory=set)
    """``(module, name, alias)`` of the block's non-legacy from-imports, so a merge never imports a name twice."""


def _format_from_import(module: str, names: list[ImportedName], multiline: bool) -> str:
    spelled = [f"{item.name} as {item.alias}" if item.alias else item.name for item in names]
    if not multiline:
        return f"from {module} import {', '.join(spelled)}"
    lines = []
    for text, item in zip(spelled, names, strict=True):
        lines.append(f"    {text},{'  ' + item.comment if item.comment else ''}")
    return f"from {module} import (\n" + "\n".join(lines) + "\n)"


def _format_import(module: str, alias: str | None) -> str:
    return f"import {module} as {alias}" if alias else f"import {module}"


def _alias_comment(alias: cst.ImportAlias) -> str | None:
    comma = alias.comma
    if isinstance(comma, cst.Comma) and isinstance(comma.whitespace_after, cst.ParenthesizedWhitespace):
        comment = comma.whitespace_after.first_line.comment
        return comment.value if comment else None
    return None


def _is_multiline(node: cst.ImportFrom) -> bool:
    return node.lpar is not None and "\n" in cst.Module([]).code_for_node(node)


def _spelled_module(node: cst.ImportFrom) -> str:
    """The module of a from-import as written, relative dots included."""
    module = dotted_name(node.module) if node.module is not None else None
    return "." * len(node.relative) + (module or "")


def _alias_name(alias: cst.ImportAlias) -> str:
    return str(dotted_name(alias.name))


def _as_name(alias: cst.ImportAlias) -> str | None:
    if alias.asname is None:
        return None
    name = alias.asname.name
    return name.value if isinstance(name, cst.Name) else None


_HOLDS_STATEMENTS = frozenset(
    {
        cst.Module,
        cst.IndentedBlock,
        cst.SimpleStatementSuite,
        cst.SimpleStatementLine,
        cst.Else,
        cst.ExceptHandler,
        cst.ExceptStarHandler,
        cst.Finally,
        cst.MatchCase,
    }
)
"""Nodes whose children can be statements, besides the compound statements: where the planner's walk goes."""


class ImportPlanner(cst.CSTVisitor):
    """Walk the module once, deciding what each legacy import statement becomes and which uses get renamed."""

    def __init__(self, command: LegacyImports) -> None:
        super().__init__()
        self.command = command
        self.table = command.table
        self.blocks: list[_BlockMerge] = [_BlockMerge()]
        self.pending: list[tuple[int, _BlockMerge, list[str]]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        """Dispatch to ``visit_<Node>``, then go deeper only where statements are: an import is a statement, never
        part of an expression, and the walk into expressions would cost as much as the rewrite itself."""
        return super().on_visit(node) and (
            type(node) in _HOLDS_STATEMENTS or isinstance(node, cst.BaseCompoundStatement)
        )

    # Blocks: names merge only within one statement list.
    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        """Enter a statement list."""
        self.blocks.append(_BlockMerge())

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock) -> None:
        """Leave a statement list."""
        self.blocks.pop()

    def visit_Import(self, node: cst.Import) -> None:
        """``import legacy [as m]``."""
        statements: list[str] = []
        kept: list[cst.ImportAlias] = []
        for alias in node.names:
            match = self.command.matcher.match(_alias_name(alias))
            if match is None or match.rest:
                kept.append(alias)
                continue
            local = _as_name(alias)
            binding = local or _alias_name(alias)
            if self._record_module_uses(node, binding, match.row, through_alias=local is not None):
                kept.append(alias)
                continue
            statements.append(_format_import(match.row.new, local))
        self._plan_rewrite(node, statements, kept, "import ")

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        """``from legacy import a, b as c`` and ``from pkg import legacy_module``."""
        level = len(node.relative)
        module = dotted_name(node.module) if node.module is not None else ""
        assert module is not None
        module_match = self.command.matcher.match(module, level=level) if (module or level) else None
        if module_match is not None and module_match.rest:
            module_match = None
        if isinstance(node.names, cst.ImportStar):
            if module_match is not None:
                self.command.note(
                    node,
                    f"star import from {module_match.row.old}: import the names you use from their new modules",
                    GuideSection.STAR_IMPORTS,
                )
            return
        if module_match is None:
            self._plan_module_imports(node, module, level)
            return
        self._plan_symbol_imports(node, module_match.row)

    def _plan_module_imports(self, node: cst.ImportFrom, module: str, level: int) -> None:
        """``from pkg import legacy_module [as m]`` -> ``import new as m``; other names stay where they are."""
        assert not isinstance(node.names, cst.ImportStar)
        statements: list[str] = []
        kept: list[cst.ImportAlias] = []
        for alias in node.names:
            name = _alias_name(alias)
            dotted = f"{module}.{name}" if module else name
            match = self.command.matcher.match(dotted, level=level)
            if match is None or match.rest:
                kept.append(alias)
                if not level:
                    self.blocks[-1].existing.add((module, name, _as_name(alias)))
                continue
            local = _as_name(alias) or name
            if self._record_module_uses(node, local, match.row, through_alias=True):
                kept.append(alias)
                continue
            statements.append(_format_import(match.row.new, local))
        self._plan_rewrite(node, statements, kept, f"from {'.' * level}{module} import ")

    def _plan_rewrite(
        self, node: cst.Import | cst.ImportFrom, statements: list[str], kept: list[cst.ImportAlias], kept_prefix: str
    ) -> None:
        """Replace ``node`` by ``statements``, preceded by one ``kept_prefix`` statement for the names that stay."""
        if not statements:
            return
        if kept:
            names = ", ".join(
                cst.Module([]).code_for_node(alias.with_changes(comma=cst.MaybeSentinel.DEFAULT)) for alias in kept
            )
            statements.insert(0, kept_prefix + names)
        self.command.statement_plans[id(node)] = StatementPlan(statements)

    def _plan_symbol_imports(self, node: cst.ImportFrom, legacy: Rename) -> None:
        assert not isinstance(node.names, cst.ImportStar)
        block = self.blocks[-1]
        placed_here: list[str] = []
        unexported = [alias for alias in node.names if self.command.command_target(legacy, _alias_name(alias)) is None]
        unexported_ids = {id(alias) for alias in unexported}
        refused = [
            alias for alias in node.names if id(alias) not in unexported_ids and self._uses_refused(node, legacy, alias)
        ]
        staying_ids = unexported_ids | {id(alias) for alias in refused}
        staying = [alias for alias in node.names if id(alias) in staying_ids]
        if len(staying) == len(node.names):
            self._report_staying(node, legacy, unexported, refused)
            return  # nothing moves: the statement stays exactly as written
        statements: list[str] = []
        if staying:
            self._report_staying(node, legacy, unexported, refused)
            kept = [ImportedName(_alias_name(alias), _as_name(alias), _alias_comment(alias)) for alias in staying]
            statements.append(_format_from_import(_spelled_module(node), kept, _is_multiline(node)))
        for alias in node.names:
            if id(alias) in staying_ids:
                continue
            old_name = _alias_name(alias)
            local = _as_name(alias)
            target = self.command.command_target(legacy, old_name)
            assert target is not None
            new_module, new_name = target
            if local is None and new_name != old_name:
                # the scope analysis only where a name changes (most of a file's time when it runs at all)
                scope = self.command.get_metadata(ScopeProvider, node, None)
                if scope is not None and (
                    _name_taken(scope, new_name, new_module) or _bound_elsewhere(scope, old_name)
                ):
                    local = old_name  # every other binding of the name (a fallback branch) keeps binding what it did
                else:
                    self._rename_binding(node, scope, old_name, new_name)
            if local == new_name:
                local = None
            imported = ImportedName(new_name, local, _alias_comment(alias))
            names = block.names_by_module.setdefault(new_module, [])
            if new_module not in block.owner_by_module:
                block.owner_by_module[new_module] = id(node)
                block.multiline_by_module[new_module] = _is_multiline(node)
                placed_here.append(new_module)
            if all((item.name, item.alias) != (imported.name, imported.alias) for item in names):
                names.append(imported)
        self.command.statement_plans[id(node)] = StatementPlan(statements)
        self.pending.append((id(node), block, placed_here))

    def _report_staying(
        self, node: cst.ImportFrom, legacy: Rename, unexported: list[cst.ImportAlias], refused: list[cst.ImportAlias]
    ) -> None:
        if unexported:
            names = ", ".join(_alias_name(alias) for alias in unexported)
            self.command.note(
                node,
                f"{names}: not exported by {legacy.new} and not in the rename table; kept on {legacy.old}",
                GuideSection.NAMES_THAT_STAY,
            )
        for alias in refused:
            old_name = _alias_name(alias)
            if self._shares_state(legacy, old_name):
                continue  # its own TODO says why
            target = self.command.command_target(legacy, old_name)
            assert target is not None
            self.command.note(
                node,
                f"{old_name}: kept on {legacy.old}, since {'.'.join(target)} does not accept every use of it here "
                "(see the TODOs at those uses)",
                GuideSection.MANUAL_STEPS,
            )

    def _shares_state(self, legacy: Rename, name: str) -> bool:
        """Whether ``name`` of the legacy module shares state with a legacy engine's runner and must stay with it."""
        row = self.table.symbol(legacy.old, name)
        return (
            row is not None
            and row.shared_state
            and not legacy.old.startswith("cudagraph.")  # the shims' names are the new objects: nothing is split
            and not self.command.context.scratch.get(MOVE_SHARED_STATE_KEY, False)
        )

    def _uses_refused(self, node: cst.ImportFrom, legacy: Rename, alias: cst.ImportAlias) -> bool:
        """Whether some use of the name ``alias`` binds is one the new API would not accept (each is noted)."""
        if self._shares_state(legacy, _alias_name(alias)):  # stays whatever its uses: no scope analysis for it
            self.command.note(node, _shared_state_message(legacy, _alias_name(alias)), GuideSection.SHARED_STATE)
            return True
        scope = self.command.get_metadata(ScopeProvider, node, None)
        local = _as_name(alias) or _alias_name(alias)
        if scope is None or local not in scope.assignments:
            return False
        target = self.command.command_target(legacy, _alias_name(alias))
        assert target is not None
        accesses = _uses_of(scope, local, node)
        legacy_name = f"{legacy.old}.{_alias_name(alias)}"
        return self._any_refused(accesses, legacy_name, ".".join(target))

    def _any_refused(self, accesses: Sequence[cst.CSTNode], legacy_name: str, new_name: str) -> bool:
        """Check every use in ``accesses`` (a name, or ``module.Name``) against the new API; note each refusal.

        A call must bind, a subclass must run on the new base, a value handed on must keep its construction contract,
        a member read off the class must exist on the new one, and a class that is patched is never swapped (see
        :mod:`cudagraph.migrate.handoffs`).
        """
        refused = False
        parent_of = self.command.parent_map()
        handoffs = self.command.handoffs
        short_old = legacy_name.rpartition(".")[2]
        builders: list[tuple[cst.ClassDef, str]] = []
        """Subclasses that move but whose builders (out of this file's sight) may build them the legacy way."""
        for access in accesses:
            use = classify_use(access, parent_of)
            parent = parent_of.get(access)
            where: cst.CSTNode = access
            if use is UseKind.CALLED:
                assert isinstance(parent, cst.Call)
                problems = self.command.checker.call_problems(parent, new_name, legacy_name)
                where, section = parent, GuideSection.CALLS
            elif use is UseKind.BASE:
                class_def = parent_of.get(parent) if parent is not None else None
                assert isinstance(class_def, cst.ClassDef)
                problems = self.command.checker.subclass_problems(class_def, new_name, legacy_name)
                where, section = class_def, GuideSection.SUBCLASSES
                if not problems and not _defines_init(class_def):
                    builders_problem = handoffs.builders_problem(class_def.name.value, new_name, legacy_name)
                    builders += [(class_def, builders_problem)] if builders_problem else []
            elif use is UseKind.VALUE:
                problems = handoffs.value_problems(new_name, legacy_name)
                section = GuideSection.HANDOFFS
            elif use is UseKind.BORROWED:
                problems = _borrow_problems(access, parent_of, short_old, new_name)
                section = GuideSection.SUBCLASSES
            elif use is UseKind.MEMBER_READ:
                member = member_named(access, parent_of)
                problem = handoffs.member_problem(new_name, legacy_name, member) if member else None
                problems, section = ([problem] if problem else []), GuideSection.PATCHED_CLASSES
            elif use is UseKind.PATCHED and not legacy_name.startswith("cudagraph."):
                member = member_named(access, parent_of)
                problems = [handoffs.patch_problem(new_name, legacy_name, [member] if member else [])]
                section = GuideSection.PATCHED_CLASSES
            else:
                continue
            if problems:
                refused = True
                if use in (UseKind.CALLED, UseKind.BASE, UseKind.BORROWED):
                    self.command.note(where, f"kept on the legacy {short_old}: {'; '.join(problems)}", section)
                else:
                    self.command.note(where, "; ".join(problems), section)
        if not refused:
            for class_def, message in builders:
                self.command.maybe(class_def, message)
        return refused

    def _record_module_uses(
        self, node: cst.Import | cst.ImportFrom, binding: str, row: Rename, *, through_alias: bool
    ) -> bool:
        """Remember every use of a binding of a legacy module, so ``binding.Name`` can be rewritten.

        Returns whether the legacy import must stay: ``binding`` is used on its own, or for a name that does not
        move (reported, and left on the legacy module).
        """
        scope = self.command.get_metadata(ScopeProvider, node, None)
        if scope is None:
            return True
        if len(scope.assignments[binding]) > 1:
            # which binding a use reaches depends on the order at run time: nothing is rewritten through it
            self.command.note(
                node,
                f"{binding} is bound more than once in this scope; the legacy import stays",
                GuideSection.MODULE_OBJECTS,
            )
            return True
        accesses = _uses_of(scope, binding, node)
        keep = False
        for access in accesses:
            parent = self.command.parent_of(access)
            if not isinstance(parent, cst.Attribute) or parent.value is not access:
                message = f"{binding} is used as a module object; the legacy import stays"
                self.command.note(access, message, GuideSection.MODULE_OBJECTS)
                keep = True
            elif self.command.command_target(row, parent.attr.value) is None:
                keep = True  # reported when the attribute is visited
        keep = self._refuse_module_uses(accesses, row) or keep
        for access in accesses:
            self.command.module_uses[id(access)] = (row, through_alias, keep)
        return keep

    def _refuse_module_uses(self, accesses: Sequence[cst.CSTNode], row: Rename) -> bool:
        """Check each ``m.Name`` that would move against the new API; every use of a refused name stays."""
        by_name: dict[str, list[cst.CSTNode]] = {}
        for access in accesses:
            parent = self.command.parent_of(access)
            if isinstance(parent, cst.Attribute) and parent.value is access:
                by_name.setdefault(parent.attr.value, []).append(access)
        refused = False
        for name, uses in by_name.items():
            target = self.command.command_target(row, name)
            if target is None:
                continue
            attributes = [self.command.parent_of(use) for use in uses]
            if self._shares_state(row, name):
                self.command.note(attributes[0], _shared_state_message(row, name), GuideSection.SHARED_STATE)
                self.command.refused_accesses.update(id(use) for use in uses)
                refused = True
                continue
            if self._any_refused([a for a in attributes if a is not None], f"{row.old}.{name}", ".".join(target)):
                refused = True
                self.command.refused_accesses.update(id(use) for use in uses)
        return refused

    def _rename_binding(self, node: cst.ImportFrom, scope: Scope | None, old: str, new: str) -> None:
        if scope is None:
            return
        for use in _uses_of(scope, old, node):
            if isinstance(use, cst.Name):
                self.command.renamed_names[id(use)] = new
            else:  # a string annotation
                self.command.renamed_strings.setdefault(id(use), {})[old] = new
        if scope is scope.globals:
            self.command.module_level_renames[old] = new

    def finish(self) -> None:
        """Write the merged ``from new import ...`` statements into the statements that own each module."""
        for statement_id, block, placed in self.pending:
            plan = self.command.statement_plans[statement_id]
            for module in placed:
                names = [
                    item
                    for item in block.names_by_module[module]
                    if (module, item.name, item.alias) not in block.existing
                ]
                if names:
                    plan.statements.append(_format_from_import(module, names, block.multiline_by_module[module]))


def _uses_of(scope: Scope, name: str, statement: cst.Import | cst.ImportFrom) -> list[cst.CSTNode]:
    """Every use of the binding ``name`` that the import ``statement`` makes in ``scope``."""
    return [
        access.node
        for assignment in scope.assignments[name]
        if isinstance(assignment, ImportAssignment) and assignment.node is statement
        for access in assignment.references
    ]


def _shared_state_message(legacy: Rename, name: str) -> str:
    return (
        f"{name} stays on {legacy.old}: it shares state (capture flag, graph pool or forward context) with that "
        "engine's graph runner, which still sets it; move it with the runner (--move-shared-state)"
    )


def _bound_elsewhere(scope: Scope, name: str) -> bool:
    """Whether ``name`` is bound more than once in ``scope`` (``try``/``except ImportError`` or ``if``/``else``
    branches each binding it): renaming the uses of one binding would leave the others' uses unbound, so the
    rewritten import keeps the name as an alias and every branch still binds what is used after it."""
    return len(scope.assignments[name]) > 1


def _name_taken(scope: Scope, name: str, new_module: str) -> bool:
    """Whether ``name`` is already bound in ``scope`` by anything but an import of that name from ``new_module``."""
    for assignment in _assignments(scope, name):
        node = getattr(assignment, "node", None)  # builtins have no defining node
        if isinstance(node, cst.ImportFrom) and node.module is not None and dotted_name(node.module) == new_module:
            continue
        return True
    return False


def _assignments(scope: Scope, name: str) -> Iterator[BaseAssignment]:
    yield from scope.assignments[name]
    if scope is not scope.globals:
        yield from scope.globals.assignments[name]


def _borrow_problems(
    access: cst.CSTNode, parent_of: Mapping[cst.CSTNode, cst.CSTNode], short_old: str, new_name: str
) -> list[str]:
    """Why a method of the legacy class run through the class object on another object cannot run the new class's
    method: the class it runs on does not derive from the legacy class (it borrows the method, and the new method
    reads state only the new class's constructor sets). Derived from it, the class moves onto the new base with it
    and is checked as a subclass."""
    holder = enclosing_class(access, parent_of)
    spelled = access.value if isinstance(access, cst.Name) else None
    if holder is not None and spelled is not None:
        for base in holder.bases:
            if isinstance(base.value, cst.Name) and base.value.value == spelled:
                return []
    member = member_named(access, parent_of)
    borrowed = f"{short_old}.{member}" if member else f"super({short_old}, ...)"
    where = f"class {holder.name.value}" if holder is not None else "an object of another class"
    new_short = new_name.rpartition(".")[2]
    return [
        f"{borrowed} runs on {where}, which does not derive from {short_old}: {new_short}'s method reads state its "
        f"own constructor sets (derive from {new_short}, or keep the legacy class)"
    ]


def _defines_init(class_def: cst.ClassDef) -> bool:
    """Whether the class body defines ``__init__`` itself."""
    body = class_def.body.body if isinstance(class_def.body, cst.IndentedBlock) else ()
    return any(isinstance(statement, cst.FunctionDef) and statement.name.value == "__init__" for statement in body)
