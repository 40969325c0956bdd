"""SGLang's options carried in dicts, for CG403: which places hold or read a legacy option key, what the report says of
each, and how ``--rewrite-engine-options`` rewrites them.

Code that drives SGLang gathers its options in a dict before handing them over: ``ENGINE_KWARGS = dict(
disable_cuda_graph=True)`` then ``Engine(**ENGINE_KWARGS)``, ``args = {"disable_cuda_graph": cfg.enforce_eager}`` then
``ServerArgs(**args)``, ``kwargs.setdefault("disable_cuda_graph", True)``. In a file that imports SGLang (where such a
key is SGLang's option as surely as a keyword of ``ServerArgs(...)`` is), these places are listed:

- a dict literal or a ``dict(...)`` call with a legacy option key, and ``d.update(...)`` with one as a keyword
  (rewritten as keywords are: :func:`.keywords.planned_options`);
- ``d.setdefault/get/pop/__getitem__/__setitem__("<option>", ...)`` and ``d["<option>"]`` (rewritten only where one
  name becomes one name; an option that became several, or a valued one, stays listed);
- a ``**`` splat into a call of ``ServerArgs``/``Engine`` of a name such places fill (listed only, at the call, naming
  the options; the places that fill it are rewritten where they stand).

A file that imports nothing of SGLang's (another engine with options of the same names) is never looked at here.
The :mod:`ast` reading (the report) and the libcst one (the rewrite) share the messages below, so a run with the flag
lists exactly what a run without it lists, less what it rewrote.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import libcst as cst

from ..api_scan import ast_dotted_name
from ..reexports import import_statements
from ..renames import Rename
from .base import MigrationCommand, dotted_name, splice, string_value, with_string_value
from .keywords import planned_options, rewrite_keywords

__all__ = [
    "DictPlace",
    "ast_carriers",
    "ast_dict_place",
    "ast_imports_any",
    "cst_carriers",
    "cst_dict_place",
    "cst_imports_any",
    "one_for_one",
    "rewrite_dict_place",
    "splat_message",
]

KEY_METHODS = frozenset({"setdefault", "get", "pop", "__getitem__", "__setitem__"})
"""Dict methods whose first argument is a key."""
KEYWORD_METHODS = frozenset({"update"})
"""Dict methods whose keywords are keys."""
FILLING_METHODS = frozenset({"setdefault", "update", "__setitem__"})
"""Dict methods that put an option into the dict (a splat of that dict hands the option on)."""
_REWRITES = "--rewrite-engine-options rewrites"


@dataclass(frozen=True)
class DictPlace:
    """One place a dict holds or reads legacy options: what the report says and whether the opt-in flag rewrites it."""

    message: str
    rewritable: bool


def one_for_one(row: Rename) -> bool:
    """Whether the option becomes exactly one other name (neither several nor a valued option)."""
    return row.value is None and not row.also


def _quoted(name: str) -> str:
    return '"' + name + '"'


def _key_spelling(row: Rename) -> str:
    if row.value is not None:
        return f"{_quoted(row.old)}: True as {_quoted(row.new)}: {_quoted(row.value)}"
    return f"{_quoted(row.old)} as {' and '.join(map(_quoted, row.targets))}"


def _keyword_spelling(row: Rename) -> str:
    if row.value is not None:
        return f'{row.old}=True as {row.new}="{row.value}"'
    return f"{row.old}= as {' and '.join(f'{target}=' for target in row.targets)}"


def dict_message(label: str, rows: Sequence[Rename], *, keywords: bool) -> str:
    """What a dict built with legacy options (a literal, ``dict(...)``, ``update(...)``) is listed with."""
    spelled = ", ".join(_keyword_spelling(row) if keywords else _key_spelling(row) for row in rows)
    return f"{label}: SGLang options in a dict; cudagraph.config spells {spelled}; {_REWRITES} them"


def key_message(label: str, row: Rename) -> str:
    """What a read or write of one legacy option key is listed with."""
    if row.value is not None:
        spelled = f"cudagraph.config chooses by value: {_quoted(row.old)} -> {_quoted(row.new)} == {_quoted(row.value)}"
    elif row.also:
        spelled = f"cudagraph.config has one option per phase: {' and '.join(map(_quoted, row.targets))}"
    else:
        spelled = f"cudagraph.config spells it {_quoted(row.new)}"
    tail = f"{_REWRITES} it" if one_for_one(row) else "not one name for one name: move it by hand"
    return f"{label}: SGLang option key; {spelled}; {tail}"


def splat_message(callee: str, carrier: str, options: Iterable[str]) -> str:
    """What a ``**`` splat into ``ServerArgs``/``Engine`` of a dict holding legacy options is listed with."""
    names = ", ".join(sorted(set(options)))
    return f"{callee}(**{carrier}): {carrier} holds legacy option(s) {names}, listed where they are set"


# --- the ast reading (the report) ----------------------------------------------------------------------------------


def ast_imports_any(tree: ast.Module, tops: frozenset[str]) -> bool:
    """Whether the file imports a module of one of the packages ``tops`` (absolute imports)."""
    for node in import_statements(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and (node.module or "").split(".")[0] in tops:
                return True
        elif any(alias.name.split(".")[0] in tops for alias in node.names):
            return True
    return False


def _ast_text(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _ast_label(node: ast.expr) -> str:
    dotted = ast_dotted_name(node)
    if dotted is not None:
        return dotted
    return f"{_ast_label(node.func)}(...)" if isinstance(node, ast.Call) else "(...)"


def _ast_subscript_key(node: ast.Subscript) -> str | None:
    return _ast_text(node.slice)


def ast_dict_place(node: ast.AST, rows: Mapping[str, Rename]) -> DictPlace | None:
    """The place ``node`` is (a dict literal, a ``dict(...)`` call, a dict method call, a subscript), if it holds or
    reads a legacy option key."""
    if isinstance(node, ast.Dict):
        legacy = [row for row in (_row(rows, _ast_text(key)) for key in node.keys) if row is not None]
        return DictPlace(dict_message("{...}", legacy, keywords=False), True) if legacy else None
    if isinstance(node, ast.Subscript):
        row = _row(rows, _ast_subscript_key(node))
        if row is not None:
            return DictPlace(key_message(f'{_ast_label(node.value)}["{row.old}"]', row), one_for_one(row))
        return None
    if not isinstance(node, ast.Call):
        return None
    method = node.func.attr if isinstance(node.func, ast.Attribute) else None
    if (isinstance(node.func, ast.Name) and node.func.id == "dict") or method in KEYWORD_METHODS:
        legacy = [row for row in (_row(rows, keyword.arg) for keyword in node.keywords) if row is not None]
        label = f"{_ast_label(node.func)}(...)"
        return DictPlace(dict_message(label, legacy, keywords=True), True) if legacy else None
    if method in KEY_METHODS and node.args:
        row = _row(rows, _ast_text(node.args[0]))
        if row is not None:
            return DictPlace(key_message(f'{_ast_label(node.func)}("{row.old}")', row), one_for_one(row))
    return None


def _row(rows: Mapping[str, Rename], key: str | None) -> Rename | None:
    return rows.get(key) if key is not None else None


def ast_carriers(tree: ast.Module, rows: Mapping[str, Rename]) -> dict[str, set[str]]:
    """Dotted names of dicts the file fills with legacy options (assigned a dict holding one, given one by
    ``setdefault``/``update``/``__setitem__`` or a subscript store), each with the options."""
    found: dict[str, set[str]] = {}

    def add(target: ast.expr, options: Iterable[str]) -> None:
        name = ast_dotted_name(target)
        options = list(options)
        if name is not None and options:
            found.setdefault(name, set()).update(options)

    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            options = _ast_options_built(node.value, rows)
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                add(target, options)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            key = _ast_subscript_key(node)
            add(node.value, [key] if key is not None and key in rows else [])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FILLING_METHODS:
            keys = [keyword.arg for keyword in node.keywords if keyword.arg in rows]
            if node.args:
                first = _ast_text(node.args[0])
                keys += [first] if first is not None and first in rows and node.func.attr != "update" else []
                keys += _ast_options_built(node.args[0], rows) if node.func.attr == "update" else []
            add(node.func.value, [key for key in keys if key is not None])
    return found


def _ast_options_built(value: ast.expr, rows: Mapping[str, Rename]) -> list[str]:
    if isinstance(value, ast.Dict):
        return [key for key in map(_ast_text, value.keys) if key in rows and key is not None]
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict":
        return [keyword.arg for keyword in value.keywords if keyword.arg in rows and keyword.arg is not None]
    return []


# --- the libcst reading and the rewrite -----------------------------------------------------------------------------


def cst_imports_any(module: cst.Module, tops: frozenset[str]) -> bool:
    """Whether the module imports a module of one of the packages ``tops`` (absolute imports), at any depth."""
    for node in _cst_imports(module.body):
        if isinstance(node, cst.ImportFrom):
            if not node.relative and node.module is not None and (dotted_name(node.module) or "").split(".")[0] in tops:
                return True
        elif any((dotted_name(alias.name) or "").split(".")[0] in tops for alias in node.names):
            return True
    return False


def _cst_imports(body: Sequence[cst.CSTNode]) -> Iterator[cst.Import | cst.ImportFrom]:
    """Import statements of a statement list and of the blocks nested in it (statements only, never expressions)."""
    pending: list[cst.CSTNode] = list(body)
    while pending:
        node = pending.pop()
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            yield node
        elif isinstance(node, cst.SimpleStatementLine):
            pending.extend(node.body)
        elif isinstance(node, cst.BaseCompoundStatement):
            pending.extend(_inner_statements(node))


def _inner_statements(node: cst.BaseCompoundStatement) -> Iterator[cst.CSTNode]:
    """The statements of a compound statement's blocks: body, ``elif``/``else``, ``except`` and ``finally``."""
    blocks: list[cst.CSTNode | None] = [
        node.body,
        getattr(node, "orelse", None),
        getattr(node, "finalbody", None),
        *getattr(node, "handlers", ()),
        *getattr(node, "cases", ()),
    ]
    for block in blocks:
        if isinstance(block, cst.If):  # an elif
            yield block
            continue
        if isinstance(block, (cst.Else, cst.Finally, cst.ExceptHandler, cst.ExceptStarHandler, cst.MatchCase)):
            block = block.body
        if isinstance(block, (cst.IndentedBlock, cst.SimpleStatementSuite)):
            yield from block.body


def _cst_label(node: cst.BaseExpression) -> str:
    dotted = dotted_name(node)
    if dotted is not None:
        return dotted
    return f"{_cst_label(node.func)}(...)" if isinstance(node, cst.Call) else "(...)"


def _cst_subscript_key(node: cst.Subscript) -> str | None:
    if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
        return None
    return string_value(node.slice[0].slice.value)


def _cst_dict_keys(node: cst.Dict) -> list[str | None]:
    return [string_value(element.key) if isinstance(element, cst.DictElement) else None for element in node.elements]


def cst_dict_place(node: cst.CSTNode, rows: Mapping[str, Rename]) -> DictPlace | None:
    """:func:`ast_dict_place` for a libcst node: the same place, the same words."""
    if isinstance(node, cst.Dict):
        legacy = [rows[key] for key in _cst_dict_keys(node) if key in rows and key is not None]
        return DictPlace(dict_message("{...}", legacy, keywords=False), True) if legacy else None
    if isinstance(node, cst.Subscript):
        key = _cst_subscript_key(node)
        if key is not None and key in rows:
            row = rows[key]
            return DictPlace(key_message(f'{_cst_label(node.value)}["{key}"]', row), one_for_one(row))
        return None
    if not isinstance(node, cst.Call):
        return None
    method = node.func.attr.value if isinstance(node.func, cst.Attribute) else None
    if (isinstance(node.func, cst.Name) and node.func.value == "dict") or method in KEYWORD_METHODS:
        legacy = [rows[arg.keyword.value] for arg in node.args if arg.keyword is not None and arg.keyword.value in rows]
        label = f"{_cst_label(node.func)}(...)"
        return DictPlace(dict_message(label, legacy, keywords=True), True) if legacy else None
    if method in KEY_METHODS and node.args and node.args[0].keyword is None and not node.args[0].star:
        key = string_value(node.args[0].value)
        if key is not None and key in rows:
            row = rows[key]
            return DictPlace(key_message(f'{_cst_label(node.func)}("{key}")', row), one_for_one(row))
    return None


def rewrite_dict_place(
    command: MigrationCommand, original: cst.CSTNode, updated: cst.CSTNode, rows: Mapping[str, Rename]
) -> cst.CSTNode:
    """``updated`` (a place :func:`cst_dict_place` found) with its legacy options rewritten, where that can be done;
    a key read or written that cannot is listed on ``command`` instead."""
    if isinstance(updated, cst.Dict):
        items = [
            (string_value(element.key) if isinstance(element, cst.DictElement) else None, element.value)
            for element in updated.elements
        ]
        plan = planned_options(command, original, items, rows)
        if not plan:
            return updated
        replacements: dict[int, list[cst.BaseDictElement]] = {}
        for index, new in plan.items():
            element = updated.elements[index]
            assert isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString)
            replacements[index] = [
                element.with_changes(key=with_string_value(element.key, name), value=value) for name, value in new
            ]
        return updated.with_changes(elements=splice(updated.elements, replacements))
    if isinstance(updated, cst.Call) and not _is_key_method(updated):
        assert isinstance(original, cst.Call)
        return rewrite_keywords(command, original, updated, rows)
    place = cst_dict_place(original, rows)
    key_node = _key_node(updated)
    key = string_value(key_node) if key_node is not None else None
    if place is None or key is None or key not in rows:
        return updated
    row = rows[key]
    if not one_for_one(row) or not isinstance(key_node, cst.SimpleString) or key_node.raw_value != key:
        command.candidate(original, place.message)
        return updated
    command.edited()
    renamed = with_string_value(key_node, row.new)
    if isinstance(updated, cst.Subscript):
        subscript = updated.slice[0]
        assert isinstance(subscript.slice, cst.Index)
        slice_ = subscript.with_changes(slice=subscript.slice.with_changes(value=renamed))
        return updated.with_changes(slice=[slice_, *updated.slice[1:]])
    assert isinstance(updated, cst.Call)
    return updated.with_changes(args=[updated.args[0].with_changes(value=renamed), *updated.args[1:]])


def _is_key_method(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value in KEY_METHODS


def _key_node(node: cst.CSTNode) -> cst.BaseExpression | None:
    if isinstance(node, cst.Subscript):
        if len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
            return node.slice[0].slice.value
        return None
    if isinstance(node, cst.Call) and node.args:
        return node.args[0].value
    return None


class _CarrierVisitor(cst.CSTVisitor):
    """:func:`ast_carriers` over a libcst tree."""

    def __init__(self, rows: Mapping[str, Rename]) -> None:
        self.rows = rows
        self.found: dict[str, set[str]] = {}

    def _add(self, target: cst.BaseExpression, options: Iterable[str]) -> None:
        name = dotted_name(target)
        options = list(options)
        if name is not None and options:
            self.found.setdefault(name, set()).update(options)

    def visit_Assign(self, node: cst.Assign) -> None:
        options = _cst_options_built(node.value, self.rows)
        for target in node.targets:
            self._add(target.target, options)
            if isinstance(target.target, cst.Subscript):
                key = _cst_subscript_key(target.target)
                self._add(target.target.value, [key] if key is not None and key in self.rows else [])

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._add(node.target, _cst_options_built(node.value, self.rows))

    def visit_Call(self, node: cst.Call) -> None:
        if not isinstance(node.func, cst.Attribute) or node.func.attr.value not in FILLING_METHODS:
            return
        method = node.func.attr.value
        keys = [arg.keyword.value for arg in node.args if arg.keyword is not None and arg.keyword.value in self.rows]
        if node.args and node.args[0].keyword is None and not node.args[0].star:
            first = node.args[0].value
            if method == "update":
                keys += _cst_options_built(first, self.rows)
            else:
                key = string_value(first)
                keys += [key] if key is not None and key in self.rows else []
        self._add(node.func.value, keys)


def _cst_options_built(value: cst.BaseExpression, rows: Mapping[str, Rename]) -> list[str]:
    if isinstance(value, cst.Dict):
        return [key for key in _cst_dict_keys(value) if key is not None and key in rows]
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "dict":
        return [arg.keyword.value for arg in value.args if arg.keyword is not None and arg.keyword.value in rows]
    return []


def cst_carriers(module: cst.Module, rows: Mapping[str, Rename]) -> dict[str, set[str]]:
    """:func:`ast_carriers` for a libcst module."""
    visitor = _CarrierVisitor(rows)
    module.visit(visitor)
    return visitor.found
