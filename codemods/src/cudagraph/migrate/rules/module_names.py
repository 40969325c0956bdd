"""What the :mod:`ast` tree of one file tells of its names: imports by local name, the file's classes and their
ancestors (SGLang's re-exports read as the class they are), and the bindings of each scope.

The report-only rules read a file with :mod:`ast` where libcst's scope analysis is not needed; they share this one
reading so a name is typed the same way by every rule. It never rewrites anything.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ..api_scan import ast_dotted_name
from ..sglang_reexports import load_sglang_reexports

__all__ = ["Binding", "Frame", "ModuleNames", "is_static", "last_name", "scope_nodes", "union_members"]


@dataclass(frozen=True)
class Binding:
    """One binding of a name in a scope: the classes its value is an instance of (None: unknown)."""

    types: frozenset[str] | None
    defines: bool = False
    """Bound by an import, a ``def`` or a ``class``: a module, function or class, not an instance."""


@dataclass
class Frame:
    """The bindings of one scope."""

    bindings: dict[str, list[Binding]] = field(default_factory=lambda: defaultdict(list))
    is_class: bool = False


class ModuleNames:
    """What the :mod:`ast` tree tells of a module's names, as far as :class:`.owners.OwnerResolver` would tell it:
    imports by local name, the file's classes and their ancestors, annotations, assignments of a call."""

    def __init__(self, tree: ast.Module) -> None:
        self.imports: dict[str, set[str]] = defaultdict(set)
        self.classes: dict[str, list[ast.ClassDef]] = defaultdict(list)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    local = alias.asname or alias.name.partition(".")[0]
                    self.imports[local].add(alias.name if alias.asname else local)
            elif isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                for alias in node.names:
                    qualified = f"{module}{alias.name}" if module.endswith(".") else f"{module}.{alias.name}"
                    self.imports[alias.asname or alias.name].add(qualified)
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name].append(node)
        self._ancestors: dict[int, frozenset[str]] = {}
        self.sglang_reexports = load_sglang_reexports()
        """Names SGLang re-exports its ``ServerArgs`` and ``Engine`` under: read as the class they are."""

    def class_types(self, node: ast.expr) -> frozenset[str]:
        """The qualified names ``node`` refers to, plus the ancestors of a class of this file."""
        dotted = ast_dotted_name(node)
        if dotted is None:
            return frozenset()
        head, _, rest = dotted.partition(".")
        found = {f"{name}.{rest}" if rest else name for name in self.imports[head]} if head in self.imports else set()
        if not found:
            found.add(dotted)
        found = {self.sglang_reexports.get(name, name) for name in found}
        if not rest:
            for class_def in self.classes.get(head, ()):
                found |= self.ancestors(class_def)
        return frozenset(found)

    def ancestors(self, class_def: ast.ClassDef) -> frozenset[str]:
        """The qualified names of ``class_def``'s bases, followed through classes of the same file."""
        key = id(class_def)
        if key not in self._ancestors:
            self._ancestors[key] = frozenset()  # a cycle (a broken file) ends here
            found: set[str] = set()
            for base in class_def.bases:
                found |= self.class_types(base)
            self._ancestors[key] = frozenset(found)
        return self._ancestors[key]

    def annotation_types(self, annotation: ast.expr) -> frozenset[str] | None:
        """``A``, ``A | None``, ``Optional[A]``: the classes named; a string annotation is not followed."""
        found: set[str] = set()
        for part in union_members(annotation):
            found |= self.class_types(part)
        return frozenset(found) if found else None

    def frame(self, body: Sequence[ast.stmt], *, is_class: bool = False) -> Frame:
        """The bindings of a module or class body."""
        frame = Frame(is_class=is_class)
        self._bind(body, frame)
        return frame

    def function_frame(self, function: ast.FunctionDef | ast.AsyncFunctionDef, owner: ast.ClassDef | None) -> Frame:
        """The bindings of a function: its parameters (``self``/``cls`` of a method: its class's ancestors), then
        its body."""
        frame = Frame()
        arguments = function.args
        positional = [*arguments.posonlyargs, *arguments.args]
        for parameter in [*positional, arguments.vararg, *arguments.kwonlyargs, arguments.kwarg]:
            if parameter is None:
                continue
            if parameter.annotation is not None:
                types = self.annotation_types(parameter.annotation)
            elif owner is not None and positional and parameter is positional[0] and not is_static(function):
                types = self.ancestors(owner)
            else:
                types = None
            frame.bindings[parameter.arg].append(Binding(types))
        self._bind(function.body, frame)
        return frame

    def _bind(self, body: Sequence[ast.stmt], frame: Frame) -> None:
        typed: dict[int, frozenset[str] | None] = {}
        for node in scope_nodes(body):
            if isinstance(node, ast.Assign):
                types = self.class_types(node.value.func) if isinstance(node.value, ast.Call) else None
                typed.update((id(target), types) for target in node.targets if isinstance(target, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                typed[id(node.target)] = self.annotation_types(node.annotation)
            elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                frame.bindings[node.id].append(Binding(typed.get(id(node))))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                frame.bindings[node.name].append(Binding(None, defines=True))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    local = alias.asname or alias.name.partition(".")[0]
                    frame.bindings[local].append(Binding(None, defines=True))
            elif isinstance(node, ast.ExceptHandler) and node.name:
                frame.bindings[node.name].append(Binding(None))


def scope_nodes(body: Sequence[ast.stmt]) -> Iterator[ast.AST]:
    """Every node of a scope's body, not descending into the scopes it opens (functions, classes, lambdas)."""
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(reversed(list(ast.iter_child_nodes(node))))


def union_members(annotation: ast.expr) -> Iterator[ast.expr]:
    """``A``, ``A | None``, ``Optional[A]``: each class expression the annotation names."""
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        yield from union_members(annotation.left)
        yield from union_members(annotation.right)
    elif isinstance(annotation, ast.Subscript) and last_name(annotation.value) == "Optional":
        yield from union_members(annotation.slice)
    elif isinstance(annotation, (ast.Name, ast.Attribute)):
        yield annotation


def last_name(node: ast.expr) -> str | None:
    """The last name of a ``Name``/``Attribute`` chain (``b`` of ``a.b``), else ``None``."""
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def is_static(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether ``function`` is decorated ``@staticmethod``."""
    return any(last_name(decorator) == "staticmethod" for decorator in function.decorator_list)
