"""Tie a call, a receiver or a class to the legacy API by libcst's scope and qualified-name analysis.

Attribute, method, enum-member, config-string and keyword renames are common words (``graph_runner``,
``disable_cuda_graph=``): other programs use the same spellings for their own APIs. Each such row of the rename table
names its *owners* (classes or functions of the legacy API, by their new qualified names), and a rename applies only
where this module ties the code to one of them:

- a call or reference whose qualified name is an owner (a legacy spelling counts: ``cudagraph.legacy.server_args.
  resolve`` is ``cudagraph.config.resolve``);
- a class whose bases, directly or through classes of the same file, include an owner;
- a receiver whose type is known here: ``self``/``cls`` of such a class, a parameter or variable annotated with an
  owner, or a variable assigned a call of one.

Everything else is either known to be something else (left alone silently) or unknown (left alone and reported).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import (
    Assignment,
    ClassScope,
    ImportAssignment,
    ParentNodeProvider,
    Scope,
    ScopeProvider,
)

from ..exports import ExportsManifest
from ..renames import RenameKind, RenameTable
from ..sglang_reexports import load_sglang_reexports

UNKNOWN = None
"""What :meth:`OwnerResolver.instance_types` returns when the receiver's type cannot be known statically."""


@dataclass(frozen=True)
class Canonicalizer:
    """Map a qualified name spelled through a legacy module to the name it has in the new packages."""

    table: RenameTable
    exports: ExportsManifest
    reexports: Mapping[str, str] = field(default_factory=dict)
    """Names the project re-exports from the legacy API (``project.module.Name -> new qualified name``)."""
    sglang_reexports: Mapping[str, str] = field(default_factory=load_sglang_reexports)
    """Names SGLang re-exports its ``ServerArgs`` and ``Engine`` under (:mod:`..sglang_reexports`)."""

    def canonical(self, qualified: str) -> str:
        """``legacy.module.Old`` -> ``new.module.New`` (symbol row, an exported name moved unchanged, a re-export);
        ``legacy.module`` -> ``new.module``; a name SGLang re-exports ``ServerArgs`` or ``Engine`` under -> that
        legacy owner (:mod:`..sglang_reexports`)."""
        if qualified in self.reexports:
            return self.reexports[qualified]
        sglang_owner = self.sglang_reexports.get(qualified)
        if sglang_owner is not None:  # SGLang's own re-export of ServerArgs or Engine: the owner it is
            return sglang_owner
        legacy_module = self.table.modules.get(qualified)
        if legacy_module is not None:  # the module itself (``from sglang... import cuda_graph_runner as cgr``)
            return legacy_module.new
        module, _, name = qualified.rpartition(".")
        row = self.table.symbol(module, name)
        if row is not None:
            return row.new
        module_row = self.table.modules.get(module)
        if module_row is not None and self.exports.exports(module_row.new, name):
            return f"{module_row.new}.{name}"
        return qualified


@dataclass(frozen=True)
class AsSpelled:
    """The identity canonicalizer: qualified names as the code spells them (a legacy name stays legacy)."""

    def canonical(self, qualified: str) -> str:
        """``qualified`` itself."""
        return qualified


def legacy_engine_names(table: RenameTable, *, shims: bool = False) -> frozenset[str]:
    """Prefixes of names that belong to a legacy engine and are not ours: the legacy modules and every row's
    ``legacy_owners``. The ``cudagraph.legacy`` shims count only with ``shims``: their objects *are* the new ones, but a
    subclass still spelled through one is a subclass whose move to the new name was refused."""
    modules = {module for module in table.modules if shims or module.split(".")[0] != "cudagraph"}
    owners = {owner for row in table for owner in row.legacy_owners}
    return frozenset(modules | owners)


def is_legacy_engine_name(qualified: str, legacy: frozenset[str]) -> bool:
    """Whether ``qualified`` (as spelled) is a legacy engine's module, or a name inside one, or a legacy owner."""
    return any(qualified == prefix or qualified.startswith(prefix + ".") for prefix in legacy)


class OwnerResolver:
    """Answers "is this tied to one of these owners?" for the nodes of one module, inside a running command.

    ``command`` is the libcst command visiting the module; it must declare :data:`OWNER_METADATA` among its metadata
    dependencies.
    """

    def __init__(self, command: cst.MetadataDependent, canonicalizer: Canonicalizer | AsSpelled) -> None:
        self.command = command
        self.canonicalizer = canonicalizer
        self._ancestors: dict[int, frozenset[str]] = {}

    # --- qualified names ---------------------------------------------------------------------------------------

    def qualified_names(self, node: cst.CSTNode) -> frozenset[str]:
        """The canonical qualified names ``node`` may refer to (empty when none is known)."""
        scope = self.command.get_metadata(ScopeProvider, node, None)
        names = scope.get_qualified_names_for(node) if scope is not None else ()
        return frozenset(self.canonicalizer.canonical(name.name) for name in names)

    def refers_to(self, node: cst.CSTNode, owners: Iterable[str]) -> bool:
        """Whether ``node`` (a callee, a class reference) names one of ``owners`` or a same-file subclass of one."""
        owners = frozenset(owners)
        return bool(self.class_types(node) & owners)

    def class_types(self, node: cst.CSTNode) -> frozenset[str]:
        """The qualified names ``node`` refers to, plus every owner-visible ancestor when it is a class of this file."""
        found = set(self.qualified_names(node))
        for class_def in self._local_classes(node):
            found |= self.ancestors(class_def)
        return frozenset(found)

    def is_known(self, node: cst.BaseExpression) -> bool:
        """Whether ``node`` (a callee) is statically known: an import, a class or function defined here, a builtin.

        A parameter, a variable or an attribute of an instance (``self.factory``) is not: what it calls is decided at
        run time.
        """
        head = node
        while isinstance(head, cst.Attribute):
            head = head.value
        if not isinstance(head, cst.Name):
            return False
        assignments = list(self._assignments(head))
        if not assignments:
            return bool(self.qualified_names(node))  # a builtin
        return all(
            isinstance(assignment, ImportAssignment)
            or (isinstance(assignment, Assignment) and isinstance(assignment.node, (cst.ClassDef, cst.FunctionDef)))
            for assignment in assignments
        ) and (head is node or self._imported_module(assignments))

    def _imported_module(self, assignments: list[object]) -> bool:
        """``module.function``: known only when the head is an imported module, not an object."""
        return all(isinstance(assignment, ImportAssignment) for assignment in assignments)

    # --- classes -----------------------------------------------------------------------------------------------

    def ancestors(self, class_def: cst.ClassDef) -> frozenset[str]:
        """The canonical qualified names of ``class_def``'s bases, followed through classes of the same file."""
        key = id(class_def)
        if key not in self._ancestors:
            self._ancestors[key] = frozenset()  # a cycle (a broken file) ends here
            found: set[str] = set()
            for base in class_def.bases:
                found |= self.class_types(base.value)
            self._ancestors[key] = frozenset(found)
        return self._ancestors[key]

    def enclosing_class(self, function: cst.FunctionDef) -> cst.ClassDef | None:
        """The class whose body defines ``function`` directly, if any."""
        parent = self.command.get_metadata(ParentNodeProvider, function, None)
        if isinstance(parent, cst.IndentedBlock):
            parent = self.command.get_metadata(ParentNodeProvider, parent, None)
        return parent if isinstance(parent, cst.ClassDef) else None

    def is_local_class(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` names a class defined in this file (the class itself, not an instance)."""
        return bool(self._local_classes(node))

    def _local_classes(self, node: cst.CSTNode) -> list[cst.ClassDef]:
        if not isinstance(node, cst.Name):
            return []
        return [
            assignment.node
            for assignment in self._assignments(node)
            if isinstance(assignment, Assignment) and isinstance(assignment.node, cst.ClassDef)
        ]

    # --- instances ---------------------------------------------------------------------------------------------

    def instance_types(self, node: cst.BaseExpression) -> frozenset[str] | None:
        """The classes ``node`` is known to be an instance of, or :data:`UNKNOWN`.

        Known: a call of a class (``Runner(...)``), ``self``/``cls`` inside a method, and names whose every binding is
        an annotated parameter or variable, or an assignment of a call.
        """
        if isinstance(node, cst.Call):
            if isinstance(node.func, cst.Name) and node.func.value == "super":
                return self._super_types(node)
            return self.class_types(node.func)
        if not isinstance(node, cst.Name):
            return UNKNOWN
        assignments = list(self._assignments(node))
        if not assignments:
            return UNKNOWN
        found: set[str] = set()
        for assignment in assignments:
            types = self._binding_types(assignment)
            if types is UNKNOWN:
                return UNKNOWN
            found |= types
        return frozenset(found)

    def _super_types(self, call: cst.Call) -> frozenset[str] | None:
        """``super()`` inside a method: the ancestors of the class that defines the method."""
        node: cst.CSTNode | None = call
        while node is not None and not isinstance(node, cst.FunctionDef):
            node = self.command.get_metadata(ParentNodeProvider, node, None)
        class_def = self.enclosing_class(node) if isinstance(node, cst.FunctionDef) else None
        return self.ancestors(class_def) if class_def is not None else UNKNOWN

    def _binding_types(self, assignment: object) -> frozenset[str] | None:
        if not isinstance(assignment, Assignment):
            return UNKNOWN  # a builtin or an import: nothing is known of its instances here
        binding = assignment.node
        if isinstance(binding, cst.Param):
            return self._parameter_types(binding)
        parent = self.command.get_metadata(ParentNodeProvider, binding, None)
        if isinstance(parent, cst.AnnAssign):
            return self._annotation_types(parent.annotation.annotation)
        if isinstance(parent, cst.AssignTarget):
            statement = self.command.get_metadata(ParentNodeProvider, parent, None)
            if isinstance(statement, cst.Assign) and isinstance(statement.value, cst.Call):
                return self.class_types(statement.value.func)
        return UNKNOWN

    def _parameter_types(self, param: cst.Param) -> frozenset[str] | None:
        if param.annotation is not None:
            return self._annotation_types(param.annotation.annotation)
        parameters = self.command.get_metadata(ParentNodeProvider, param, None)
        function = self.command.get_metadata(ParentNodeProvider, parameters, None) if parameters else None
        if not isinstance(function, cst.FunctionDef) or not isinstance(parameters, cst.Parameters):
            return UNKNOWN
        first = parameters.params[0] if parameters.params else None
        class_def = self.enclosing_class(function)
        if first is not param or class_def is None or _is_static(function):
            return UNKNOWN
        return self.ancestors(class_def)  # self (or cls): the class's owners are what matter

    def _annotation_types(self, annotation: cst.BaseExpression) -> frozenset[str] | None:
        parts = list(_union_members(annotation))
        if not parts:
            return UNKNOWN
        found: set[str] = set()
        for part in parts:
            found |= self.class_types(part)
        return frozenset(found) if found else UNKNOWN

    def _assignments(self, node: cst.Name) -> Iterable[object]:
        scope = self.command.get_metadata(ScopeProvider, node, None)
        if not isinstance(scope, Scope):
            return ()
        while isinstance(scope, ClassScope):  # names in a class body resolve outside it when not bound there
            if node.value in scope.assignments:
                break
            scope = scope.parent
        return tuple(scope[node.value]) if node.value in scope else ()


OWNER_METADATA = (ScopeProvider, ParentNodeProvider)
"""The metadata a command using :class:`OwnerResolver` must declare. Qualified names are asked of a node's scope when
needed, as ``QualifiedNameProvider`` would on the first read of a node, without its walk over every node."""


REEXPORTS_KEY = "cudagraph.migrate.reexports"
"""``CodemodContext.scratch`` key of the run's re-export map."""


def canonicalizer_for(command: cst.MetadataDependent) -> Canonicalizer:
    """The canonicalizer of a running rule command: its table, manifest and the run's re-exports."""
    reexports = command.context.scratch.get(REEXPORTS_KEY, {})  # type: ignore[attr-defined]
    return Canonicalizer(command.table, command.exports, reexports)  # type: ignore[attr-defined]


def owner_rows(table: RenameTable, *kinds: RenameKind) -> dict[str, tuple[str, tuple[str, ...]]]:
    """``old -> (new, owners)`` for the rows of ``kinds``."""
    return {row.old: (row.new, row.owners) for row in table.of_kind(*kinds)}


def _union_members(annotation: cst.BaseExpression) -> Iterable[cst.BaseExpression]:
    """``A | None`` -> A; ``Optional[A]`` -> A; a string annotation is not followed."""
    if isinstance(annotation, cst.BinaryOperation) and isinstance(annotation.operator, cst.BitOr):
        yield from _union_members(annotation.left)
        yield from _union_members(annotation.right)
    elif isinstance(annotation, cst.Subscript) and _last_name(annotation.value) == "Optional":
        for element in annotation.slice:
            if isinstance(element.slice, cst.Index):
                yield from _union_members(element.slice.value)
    elif isinstance(annotation, cst.Name) and annotation.value == "None":
        return
    elif isinstance(annotation, (cst.Name, cst.Attribute)):
        yield annotation


def _last_name(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return None


def _is_static(function: cst.FunctionDef) -> bool:
    return any(_last_name(decorator.decorator) == "staticmethod" for decorator in function.decorators)
