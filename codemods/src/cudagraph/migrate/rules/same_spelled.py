"""The same-spelled names of a file that reaches no owner, read off the :mod:`ast` tree.

A rule tied to owners (CG201 members, CG301 enum members, CG302 config strings, CG401 keywords) renames only what
:mod:`.owners` ties to an owner, and where a file imports no owner nothing can be tied: libcst is never run for the
rule there. Every place spelled like one of its rows is still listed, as the libcst visit would list it and with the
same words, so that ``-v`` names every same-spelled name left alone (file and line), and a legacy member on a
receiver of unknown type in a file tied to a legacy engine is listed for review ("maybe tied").

The receivers are typed as :class:`.owners.OwnerResolver` types them: ``self``/``cls`` of a method, an annotated
parameter or variable, a variable assigned a call, a call, a class of this file are known (and, here, none of them is
an owner's); anything else is unknown. This module never rewrites and never parses with libcst.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from ..api_scan import ast_dotted_name
from ..renames import RenameKind, RenameTable
from .base import Finding, FindingKind
from .module_names import ModuleNames, is_static, last_name, scope_nodes

__all__ = [
    "MEMBER_KINDS",
    "NAME_STRING_CALLS",
    "PATCH_OBJECT_CALLS",
    "MemberScan",
    "config_string_findings",
    "definition_message",
    "enum_member_findings",
    "keyword_findings",
    "maybe_message",
    "not_tied_message",
]

MEMBER_KINDS = (RenameKind.ATTRIBUTE, RenameKind.METHOD)
"""The row kinds CG201 renames."""
NAME_STRING_CALLS = frozenset({"getattr", "hasattr", "setattr", "delattr"})
"""Calls whose second argument names an attribute of the first (an instance)."""
PATCH_OBJECT_CALLS = frozenset({"object"})
"""``mock.patch.object(target, "name")`` / ``patch.object``: the target is usually a class."""


def not_tied_message(name: str, owners: Sequence[str]) -> str:
    """A legacy member left alone on a receiver not tied to its owners (a ``skip``)."""
    return f".{name}: receiver not tied to {', '.join(owners)}; left as written"


def maybe_message(name: str, new: str, legacy_owners: Sequence[str]) -> str:
    """A legacy member on a receiver of unknown type in a file tied to a legacy engine (listed for review)."""
    engine = " or ".join(legacy_owners) or "the legacy engine's class"
    return (
        f".{name}: maybe tied: the receiver's type is unknown in a file that imports a legacy engine; if it is "
        f"{engine}, cudagraph's classes spell it {new}; left as written"
    )


def definition_message(name: str, class_name: str, owners: Sequence[str]) -> str:
    """A member of the legacy name defined in a class that derives from none of its owners (a ``skip``)."""
    return f"{name}: defined in {class_name}, which derives from none of {', '.join(owners)}; left as written"


def enum_message(name: str, owners: Sequence[str]) -> str:
    """An enum member of the legacy name not reached through its owner enum (a ``skip``)."""
    return f".{name}: not reached through {', '.join(owners)}; left as written"


def config_string_message(value: str, owners: Sequence[str]) -> str:
    """A legacy config value outside the arguments of its owners (a ``skip``)."""
    return f"{value!r}: not an argument of {', '.join(owners)}; left as written"


def keyword_message(keyword: str, owners: Iterable[str]) -> str:
    """A legacy keyword passed to a callee not tied to its owners (a ``skip``)."""
    return f"{keyword}=: callee not tied to {', '.join(sorted(owners))}; left as written"


# --- CG201: members -------------------------------------------------------------------------------------------------


class _Bound:
    """What one binding of a name holds, as far as the owner checks tell."""

    KNOWN = "known"
    """An instance of a known class (annotated, assigned a call, ``self``)."""
    UNKNOWN = "unknown"
    CLASS = "class"
    """A class defined in this file."""


@dataclass
class _Frame:
    """The bindings of one scope: per name, what each binding holds."""

    bindings: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    is_class: bool = False


class MemberScan(ast.NodeVisitor):
    """CG201's findings in a file that reaches no owner: every legacy member spelling, none of them renamed.

    ``receiver.old``, ``getattr``/``hasattr``/``setattr``/``delattr(receiver, "old")`` and ``patch.object(receiver,
    "old")`` are listed as not tied where the receiver is known (it can be no owner's here) and, where it is unknown,
    as maybe tied in a file tied to a legacy engine, else as not tied; a member of that name defined in a class body is
    listed as not tied.
    """

    def __init__(self, table: RenameTable, code: str, *, tied_to_legacy_engine: bool) -> None:
        self.rows = {row.old: row for row in table.of_kind(*MEMBER_KINDS)}
        self.code = code
        self.tied_to_legacy_engine = tied_to_legacy_engine
        self.frames: list[_Frame] = []
        self.classes: list[ast.ClassDef] = []
        self.function_depth: list[int] = [0]
        self.findings: list[Finding] = []

    # scopes

    def visit_Module(self, node: ast.Module) -> None:
        """The module's bindings, then its body."""
        self.frames.append(_frame(node.body))
        self.generic_visit(node)
        self.frames.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        """Bases and decorators outside; the body in the class's own scope."""
        for outside in [*node.decorator_list, *node.bases, *(keyword.value for keyword in node.keywords)]:
            self.visit(outside)
        self.frames.append(_frame(node.body, is_class=True))
        self.classes.append(node)
        self.function_depth.append(0)
        for statement in node.body:
            self.visit(statement)
        self.function_depth.pop()
        self.classes.pop()
        self.frames.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """A method defined directly in a class body is a definition; its body is a scope of its own."""
        method_of = self.classes[-1] if self.classes and not self.function_depth[-1] else None
        if method_of is not None:
            self._definition(node, node.name, method_of)
        arguments = node.args
        for outside in [
            *node.decorator_list,
            *arguments.defaults,
            *(value for value in arguments.kw_defaults if value),
        ]:
            self.visit(outside)
        for annotation in _annotations(node):
            self.visit(annotation)
        self.frames.append(_function_frame(node, method_of))
        self.function_depth[-1] += 1
        for statement in node.body:
            self.visit(statement)
        self.function_depth[-1] -= 1
        self.frames.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        """Its parameters are of unknown type."""
        frame = _Frame()
        for parameter in _parameters(node.args):
            frame.bindings[parameter.arg].append(_Bound.UNKNOWN)
        self.frames.append(frame)
        self.function_depth[-1] += 1
        self.visit(node.body)
        self.function_depth[-1] -= 1
        self.frames.pop()

    def visit_Import(self, node: ast.Import) -> None:
        """Module paths in imports are CG101's."""

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        """Module paths in imports are CG101's."""

    # the places

    def visit_Assign(self, node: ast.Assign) -> None:
        """A class-level attribute default (``graph_runner = None``)."""
        self._class_level([target for target in node.targets if isinstance(target, ast.Name)], node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        """A class-level attribute declaration (``graph_runner: Runner | None = None``)."""
        if isinstance(node.target, ast.Name):
            self._class_level([node.target], node)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        """``receiver.old``."""
        if node.attr in self.rows:
            self._use(node.value, node.attr, node.lineno)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        """``getattr(receiver, "old")`` and friends, ``patch.object(receiver, "old")``."""
        callee = ast_dotted_name(node.func)
        short = callee.rpartition(".")[2] if callee else None
        if short in NAME_STRING_CALLS | PATCH_OBJECT_CALLS and len(node.args) >= 2:
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and name.value in self.rows:
                self._use(node.args[0], name.value, node.lineno)
        self.generic_visit(node)

    def _class_level(self, targets: Sequence[ast.Name], statement: ast.stmt) -> None:
        if self.classes and not self.function_depth[-1]:
            for target in targets:
                self._definition(statement, target.id, self.classes[-1])

    def _definition(self, node: ast.stmt, name: str, class_def: ast.ClassDef) -> None:
        row = self.rows.get(name)
        if row is not None:
            line = min([node.lineno, *(decorator.lineno for decorator in getattr(node, "decorator_list", ()))])
            self._report(FindingKind.SKIP, line, definition_message(name, class_def.name, row.owners))

    def _use(self, receiver: ast.expr, name: str, line: int) -> None:
        row = self.rows[name]
        if self._known(receiver) or not self.tied_to_legacy_engine:
            self._report(FindingKind.SKIP, line, not_tied_message(name, row.owners))
        else:
            self._report(FindingKind.MAYBE, line, maybe_message(name, row.new, row.legacy_owners))

    def _report(self, kind: FindingKind, line: int, message: str) -> None:
        self.findings.append(Finding(kind, self.code, line, message))

    # receivers

    def _known(self, receiver: ast.expr) -> bool:
        """Whether the receiver's type is known (an instance of a known class, or a class of this file)."""
        if isinstance(receiver, ast.Call):
            return not (isinstance(receiver.func, ast.Name) and receiver.func.id == "super") or bool(self.classes)
        if not isinstance(receiver, ast.Name):
            return False
        bindings = self._bindings(receiver.id)
        if _Bound.CLASS in bindings:
            return True
        return bool(bindings) and all(bound == _Bound.KNOWN for bound in bindings)

    def _bindings(self, name: str) -> list[str]:
        """The bindings of ``name`` in the innermost scope that binds it (a class body is not seen from its methods)."""
        for frame in reversed(self.frames):
            if frame.is_class and frame is not self.frames[-1]:
                continue
            if name in frame.bindings:
                return frame.bindings[name]
        return []


def _frame(body: Sequence[ast.stmt], *, is_class: bool = False) -> _Frame:
    frame = _Frame(is_class=is_class)
    _bind(body, frame)
    return frame


def _function_frame(function: ast.FunctionDef | ast.AsyncFunctionDef, method_of: ast.ClassDef | None) -> _Frame:
    """Parameters (the first of a method: its class), then the body's bindings."""
    frame = _Frame()
    positional = [*function.args.posonlyargs, *function.args.args]
    for parameter in _parameters(function.args):
        if parameter.annotation is not None:
            bound = _Bound.KNOWN if _names_a_class(parameter.annotation) else _Bound.UNKNOWN
        elif method_of is not None and positional and parameter is positional[0] and not is_static(function):
            bound = _Bound.KNOWN
        else:
            bound = _Bound.UNKNOWN
        frame.bindings[parameter.arg].append(bound)
    _bind(function.body, frame)
    return frame


def _bind(body: Sequence[ast.stmt], frame: _Frame) -> None:
    typed: dict[int, str] = {}
    for node in scope_nodes(body):
        if isinstance(node, ast.Assign):
            bound = _Bound.KNOWN if isinstance(node.value, ast.Call) else _Bound.UNKNOWN
            typed.update((id(target), bound) for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            typed[id(node.target)] = _Bound.KNOWN if _names_a_class(node.annotation) else _Bound.UNKNOWN
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            frame.bindings[node.id].append(typed.get(id(node), _Bound.UNKNOWN))
        elif isinstance(node, ast.ClassDef):
            frame.bindings[node.name].append(_Bound.CLASS)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            frame.bindings[node.name].append(_Bound.UNKNOWN)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                frame.bindings[alias.asname or alias.name.partition(".")[0]].append(_Bound.UNKNOWN)


def _names_a_class(annotation: ast.expr) -> bool:
    """``A``, ``a.A``, ``A | None``, ``Optional[A]``: names a class (a string annotation is not followed)."""
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return _names_a_class(annotation.left) or _names_a_class(annotation.right)
    if isinstance(annotation, ast.Subscript) and last_name(annotation.value) == "Optional":
        return _names_a_class(annotation.slice)
    if isinstance(annotation, ast.Name):
        return annotation.id != "None"
    return isinstance(annotation, ast.Attribute) and ast_dotted_name(annotation) is not None


def _parameters(arguments: ast.arguments) -> Iterator[ast.arg]:
    for parameter in [*arguments.posonlyargs, *arguments.args, arguments.vararg, *arguments.kwonlyargs]:
        if parameter is not None:
            yield parameter
    if arguments.kwarg is not None:
        yield arguments.kwarg


def _annotations(function: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.expr]:
    for parameter in _parameters(function.args):
        if parameter.annotation is not None:
            yield parameter.annotation
    if function.returns is not None:
        yield function.returns


# --- CG301, CG302, CG401: nothing to type, only where the spellings occur ------------------------------------------


def enum_member_findings(tree: ast.Module, table: RenameTable, code: str) -> list[Finding]:
    """Every ``X.OLD`` of an ``enum_member`` row: none can be reached through its owner enum here."""
    rows = {row.old: row for row in table.of_kind(RenameKind.ENUM_MEMBER)}
    return [
        Finding(FindingKind.SKIP, code, node.lineno, enum_message(node.attr, rows[node.attr].owners))
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in rows
    ]


def config_string_findings(tree: ast.Module, table: RenameTable, code: str) -> list[Finding]:
    """Every string literal that is exactly a ``config_string`` row's value: none can be an owner's argument here."""
    rows = {row.old: row for row in table.of_kind(RenameKind.CONFIG_STRING)}
    in_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    return [
        Finding(FindingKind.SKIP, code, node.lineno, config_string_message(node.value, rows[node.value].owners))
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in rows
        and id(node) not in in_fstrings
    ]


def keyword_findings(tree: ast.Module, table: RenameTable, code: str) -> list[Finding]:
    """Every call passing a ``kwarg`` row's keyword: none can be an owner's here. A call of a legacy engine's class
    that takes the option (``ServerArgs``, ``Engine``, a subclass of this file) is CG403's to list for review, not
    this rule's."""
    rows = {row.old: row for row in table.of_kind(RenameKind.KWARG)}
    callees = ModuleNames(tree)
    findings = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        legacy = [keyword.arg for keyword in node.keywords if keyword.arg is not None and keyword.arg in rows]
        if not legacy:
            continue
        takers = frozenset(owner for name in legacy for owner in rows[name].legacy_owners)
        if callees.class_types(node.func) & takers:
            continue
        owners = frozenset(owner for name in legacy for owner in rows[name].owners)
        findings.append(Finding(FindingKind.SKIP, code, node.lineno, keyword_message(legacy[0], owners)))
    return findings
