"""Read an API's surface from its source with :mod:`ast`: each class's members and method signatures, each function's
signature. Nothing is imported, so it works on a checkout without torch and on another project's released sources.

One reader serves both sides of the codemods' checks: the exports manifest (the cudagraph packages, :mod:`.exports`)
and the legacy data (SGLang's sources, :mod:`.legacy_api`). The surface of a class includes what it inherits from
classes of the same tree (first definition wins, bases left to right); an ancestor outside the tree makes the class
``open`` unless it is a standard one whose members are known. Only the standard library is imported, never the tree.
"""

from __future__ import annotations

import abc
import ast
import enum
import functools
import sys
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from .python_ast import parse_ast
from .signatures import Param, ParamKind, Signature

__all__ = ["ClassSurface", "SourceTree", "ast_dotted_name", "signature_of_arguments"]

_STANDARD_BASES: dict[str, object] = {
    "object": object,
    "abc.ABC": abc.ABC,
    "typing.Protocol": typing.Protocol,
    "typing.Generic": typing.Generic,
    "enum.Enum": enum.Enum,
    "enum.IntEnum": enum.IntEnum,
    "str": str,
    "int": int,
    "Exception": Exception,
    "ValueError": ValueError,
    "RuntimeError": RuntimeError,
    "TypeError": TypeError,
    "KeyError": KeyError,
    "ImportError": ImportError,
    "NotImplementedError": NotImplementedError,
    "DeprecationWarning": DeprecationWarning,
    "UserWarning": UserWarning,
    "FutureWarning": FutureWarning,
}
if sys.version_info >= (3, 11):
    _STANDARD_BASES["enum.StrEnum"] = enum.StrEnum

CLOSED_BASES: Mapping[str, object] = MappingProxyType(_STANDARD_BASES)
"""Standard-library ancestors whose members are known (read from the running interpreter), by the name a class
statement spells them with: a class whose ancestors outside the tree are all here is not ``open``."""


@dataclass
class ClassSurface:
    """What :meth:`SourceTree.class_surface` finds: bases, members, methods (with ``self``), and openness."""

    bases: list[str]
    members: set[str]
    methods: dict[str, Signature]
    open: bool

    def to_json(self) -> dict[str, object]:
        """Sorted members and each method's signature as :meth:`Signature.to_json` spells it, and the rest as is."""
        methods = {name: signature.to_json() for name, signature in sorted(self.methods.items())}
        return {"bases": self.bases, "members": sorted(self.members), "methods": methods, "open": self.open}


def signature_of_arguments(arguments: ast.arguments) -> Signature:
    """The signature a ``def``'s arguments declare."""
    params: list[Param] = []
    positional = [*arguments.posonlyargs, *arguments.args]
    first_default = len(positional) - len(arguments.defaults)
    for index, arg in enumerate(positional):
        kind = ParamKind.POSITIONAL_ONLY if index < len(arguments.posonlyargs) else ParamKind.POSITIONAL_OR_KEYWORD
        params.append(Param(arg.arg, kind, index < first_default))
    if arguments.vararg is not None:
        params.append(Param(arguments.vararg.arg, ParamKind.VAR_POSITIONAL, False))
    for arg, default in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True):
        params.append(Param(arg.arg, ParamKind.KEYWORD_ONLY, default is None))
    if arguments.kwarg is not None:
        params.append(Param(arguments.kwarg.arg, ParamKind.VAR_KEYWORD, False))
    return Signature(tuple(params))


class SourceTree:
    """The modules of one top-level package under some source roots (``packages/*/src``, a release's folder)."""

    def __init__(self, roots: Sequence[Path], top: str) -> None:
        self.roots = tuple(roots)
        self.top = top
        self.module_tree = functools.cache(self._module_tree)

    def _module_tree(self, module: str) -> tuple[ast.Module, bool] | None:
        """The parsed module and whether it is a package ``__init__``."""
        parts = module.split(".")
        for root in self.roots:
            for candidate, is_package in (
                (root.joinpath(*parts).with_suffix(".py"), False),
                (root.joinpath(*parts, "__init__.py"), True),
            ):
                if candidate.is_file():
                    return parse_ast(candidate.read_bytes(), filename=str(candidate)), is_package
        return None

    def modules(self) -> Iterator[str]:
        """Every module of the package under the roots, by dotted name (a package by its own name), sorted per root."""
        for root in self.roots:
            package = root / self.top
            for path in sorted(package.rglob("*.py")):
                parts = list(path.relative_to(root).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                if all(part.isidentifier() for part in parts):
                    yield ".".join(parts)

    def imports(self, module: str) -> dict[str, str]:
        """Local name -> qualified name, for the from-imports and plain imports of ``module``."""
        found = self.module_tree(module)
        if found is None:
            return {}
        tree, is_package = found
        names: dict[str, str] = {}
        for statement in tree.body:
            if isinstance(statement, (ast.Import, ast.ImportFrom)):
                names.update(self._import_bindings(module, is_package, statement))
        return names

    def runtime_imports(self, module: str) -> dict[str, str]:
        """Local name -> qualified name of every name ``module`` binds by import when it runs: its top-level imports,
        those inside top-level ``if``/``try`` statements (not under ``if TYPE_CHECKING:``, which never runs), and lazy
        imports spelled ``Name = LazyImport("module", "Name")``. A later import of a name replaces an earlier one; an
        assignment of anything else removes it, unless it is in a branch (an ``except`` fallback may never run)."""
        found = self.module_tree(module)
        if found is None:
            return {}
        tree, is_package = found
        names: dict[str, str] = {}
        for statement, nested in _runtime_statements(tree.body):
            if isinstance(statement, (ast.Import, ast.ImportFrom)):
                names.update(self._import_bindings(module, is_package, statement))
            elif isinstance(statement, ast.Assign):
                lazy = _lazy_import(statement.value)
                for target in statement.targets:
                    if isinstance(target, ast.Name):
                        if lazy is not None:
                            names[target.id] = lazy
                        elif not nested:  # rebound to something else for good (a branch may not run)
                            names.pop(target.id, None)
        return names

    @classmethod
    def _import_bindings(
        cls, module: str, is_package: bool, statement: ast.Import | ast.ImportFrom
    ) -> Iterator[tuple[str, str]]:
        """``(local name, qualified name)`` for each name an import statement of ``module`` binds."""
        if isinstance(statement, ast.ImportFrom):
            source = cls._absolute(module, is_package, statement.level, statement.module)
            for alias in statement.names:
                yield alias.asname or alias.name, f"{source}.{alias.name}"
            return
        for alias in statement.names:
            head = alias.name.split(".")[0]
            yield (alias.asname, alias.name) if alias.asname else (head, head)

    @staticmethod
    def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
        if not level:
            return name or ""
        parts = module.split(".")
        base = parts if is_package else parts[:-1]
        base = base[: len(base) - (level - 1)] if level > 1 else base
        return ".".join([*base, *([name] if name else [])])

    def definition(self, qualified: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """``(defining module, node)`` of a class or function, following re-exports inside the tree and module-level
        aliases (``register_split_op = register_break_op`` exports one function under two names)."""
        module, _, name = qualified.rpartition(".")
        found = self.module_tree(module)
        if found is None or depth > 6:
            return None
        for statement in found[0].body:
            if isinstance(statement, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == name:
                return module, statement
        target = self.imports(module).get(name)
        if target is not None:
            return self.definition(target, depth + 1) if target.split(".")[0] == self.top else None
        for statement in found[0].body:
            if (
                isinstance(statement, ast.Assign)
                and [_name(target) for target in statement.targets] == [name]
                and _name(statement.value) is not None
            ):
                return self.definition(f"{module}.{_name(statement.value)}", depth + 1)
        return None

    def class_surface(self, module: str, node: ast.ClassDef, depth: int = 0) -> ClassSurface:
        """Members and methods of ``node`` (defined in ``module``), with what it inherits inside the tree."""
        members: set[str] = set()
        methods: dict[str, Signature] = {}
        for statement in node.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                members.add(statement.name)
                if not _is_property(statement):
                    methods[statement.name] = _method_signature(statement)
                members.update(_receiver_assignments(statement))
            elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                members.add(statement.target.id)
            elif isinstance(statement, ast.Assign):
                members.update(target.id for target in statement.targets if isinstance(target, ast.Name))
        bases = [self._qualified_base(module, base) for base in node.bases]
        surface = ClassSurface([base for base in bases if base], set(members), dict(methods), open=False)
        fields = _dataclass_fields(node)
        for base in surface.bases:
            inherited = self._inherited(base, depth)
            if inherited is None:
                surface.open = surface.open or base not in CLOSED_BASES
                surface.members |= _standard_members(base)
                continue
            surface.members |= inherited.members
            surface.open = surface.open or inherited.open
            for name, signature in inherited.methods.items():
                surface.methods.setdefault(name, signature)
            if fields is not None and "__init__" in inherited.methods and "__init__" not in methods:
                fields = [*_init_fields(inherited.methods["__init__"]), *fields]
        if fields is not None and "__init__" not in methods:
            surface.methods["__init__"] = Signature((Param("self", ParamKind.POSITIONAL_OR_KEYWORD, True), *fields))
        return surface

    def _inherited(self, base: str, depth: int) -> ClassSurface | None:
        if base.split(".")[0] != self.top or depth > 6:
            return None
        found = self.definition(base)
        if found is None or not isinstance(found[1], ast.ClassDef):
            return None
        return self.class_surface(found[0], found[1], depth + 1)

    def _qualified_base(self, module: str, base: ast.expr) -> str | None:
        if isinstance(base, ast.Subscript):  # Generic[T], Protocol[T]
            base = base.value
        dotted = ast_dotted_name(base)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        imported = self.imports(module).get(head)
        if imported is not None:
            return f"{imported}.{rest}" if rest else imported
        if self.definition(f"{module}.{head}") is not None and not rest:
            return f"{module}.{head}"
        return dotted


_LAZY_IMPORTERS = frozenset({"LazyImport"})
"""Callables a module binds a name lazily with, as ``Name = LazyImport("module", "Name")`` (SGLang's top level)."""


def _lazy_import(value: ast.expr) -> str | None:
    """``module.Name`` of ``LazyImport("module", "Name")``, else None."""
    if not isinstance(value, ast.Call) or (ast_dotted_name(value.func) or "").rpartition(".")[2] not in _LAZY_IMPORTERS:
        return None
    texts = [arg.value for arg in value.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
    return f"{texts[0]}.{texts[1]}" if len(texts) == 2 == len(value.args) else None


def _runtime_statements(body: Sequence[ast.stmt], nested: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    """The statements of a module body in order, with those of top-level ``if``/``try`` blocks in their place (and
    ``True`` beside them), except the body of ``if TYPE_CHECKING:`` (its ``else`` runs)."""
    for statement in body:
        if isinstance(statement, ast.If):
            if (ast_dotted_name(statement.test) or "").rpartition(".")[2] != "TYPE_CHECKING":
                yield from _runtime_statements(statement.body, True)
            yield from _runtime_statements(statement.orelse, True)
        elif isinstance(statement, ast.Try):
            yield from _runtime_statements(statement.body, True)
            for handler in statement.handlers:
                yield from _runtime_statements(handler.body, True)
            yield from _runtime_statements([*statement.orelse, *statement.finalbody], True)
        else:
            yield statement, nested


@functools.cache
def _standard_members(qualified: str) -> frozenset[str]:
    """The public members a standard-library base gives its subclasses (``Exception.args``, ``Enum.value``)."""
    base = CLOSED_BASES.get(qualified)
    if base is None:
        return frozenset()
    return frozenset(member for member in dir(base) if not member.startswith("__"))


def _name(node: ast.expr) -> str | None:
    return node.id if isinstance(node, ast.Name) else None


def ast_dotted_name(node: ast.expr) -> str | None:
    """``a.b.c`` for an :mod:`ast` Name/Attribute chain, else ``None`` (``rules.base.dotted_name`` for libcst)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = ast_dotted_name(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def _decorator_names(function: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> Iterator[str]:
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        dotted = ast_dotted_name(target)
        if dotted:
            yield dotted.rpartition(".")[2]


def _is_property(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(
        name in ("property", "cached_property", "setter", "getter", "deleter") for name in _decorator_names(function)
    )


def _method_signature(function: ast.FunctionDef | ast.AsyncFunctionDef) -> Signature:
    signature = signature_of_arguments(function.args)
    if "staticmethod" in set(_decorator_names(function)):
        # stored with a stand-in receiver so every method signature drops its first parameter alike
        return Signature((Param("self", ParamKind.POSITIONAL_OR_KEYWORD, True), *signature.params))
    return signature


def _receiver_assignments(function: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[str]:
    if not function.args.args:
        return
    receiver = function.args.args[0].arg
    for node in ast.walk(function):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for target in targets:
            for element in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
                if (
                    isinstance(element, ast.Attribute)
                    and isinstance(element.value, ast.Name)
                    and element.value.id == receiver
                ):
                    yield element.attr


def _dataclass_fields(node: ast.ClassDef) -> list[Param] | None:
    """The ``__init__`` parameters a ``@dataclass`` generates from its fields, or None for other classes."""
    if "dataclass" not in set(_decorator_names(node)):
        return None
    keyword_only = any(
        isinstance(decorator, ast.Call)
        and any(keyword.arg == "kw_only" and _is_true(keyword.value) for keyword in decorator.keywords)
        for decorator in node.decorator_list
    )
    params: list[Param] = []
    for statement in node.body:
        if not isinstance(statement, ast.AnnAssign) or not isinstance(statement.target, ast.Name):
            continue
        annotation = ast.unparse(statement.annotation)
        if annotation.startswith(("ClassVar", "typing.ClassVar")):
            continue
        required, in_init = _field_default(statement.value)
        if in_init:
            kind = ParamKind.KEYWORD_ONLY if keyword_only else ParamKind.POSITIONAL_OR_KEYWORD
            params.append(Param(statement.target.id, kind, required))
    return params


def _field_default(value: ast.expr | None) -> tuple[bool, bool]:
    """(required, in ``__init__``) of a dataclass field with this default."""
    if value is None:
        return True, True
    if isinstance(value, ast.Call) and ast_dotted_name(value.func) in ("field", "dataclasses.field"):
        keywords = {keyword.arg: keyword.value for keyword in value.keywords}
        in_init = not ("init" in keywords and not _is_true(keywords["init"]))
        return not ({"default", "default_factory"} & set(keywords)), in_init
    return False, True


def _init_fields(init: Signature) -> list[Param]:
    return list(init.without_first().params)


def _is_true(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is True
