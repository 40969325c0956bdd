"""CG403: legacy options of another engine's Python API, driven by the ``legacy_owners`` of ``kwarg`` rows.

SGLang's ``ServerArgs`` and ``Engine`` take ``disable_cuda_graph``, ``cuda_graph_max_bs``, ... themselves: they are
that engine's options, which it defines and parses, not ``cudagraph.config``'s. Code that passes or reads them is
listed for review with the spelling ``cudagraph.config`` gives the option, and rewritten only with
``--rewrite-engine-options`` (the user's word that the engine now takes our options):

- keyword calls of a legacy owner: ``ServerArgs(cuda_graph_max_bs=8)``, ``sglang.Engine(...)``, a subclass of either
  (rewritten exactly as CG401 rewrites ``resolve(...)``: :func:`.keywords.rewrite_keywords`);
- reads and writes of an option on a receiver tied to a legacy owner (an annotated parameter or variable, a variable
  assigned ``ServerArgs(...)``, ``self`` in a subclass, the class itself): rewritten only where one name becomes one
  name; an option that became several (``disable_cuda_graph``) or a valued option (``enable_breakable_cuda_graph``)
  stays listed;
- the same on any other receiver named ``server_args`` (SGLang passes it around unannotated, or assigns it what
  ``prepare_server_args(...)`` returns): listed, saying the type was not proven, never rewritten;
- in a file that imports SGLang, dicts carrying its options (a literal or ``dict(...)`` with a legacy option key,
  ``d.setdefault/get/pop/update/__getitem__/__setitem__`` and ``d[...]`` with one) and ``**`` splats of such a dict
  into a legacy owner (:mod:`.option_dicts`).

A legacy owner is recognised through SGLang's own re-exports too (``from sglang.srt.entrypoints.http_server import
ServerArgs``, ``sglang.ServerArgs``): :mod:`cudagraph.migrate.sglang_reexports`.

The engine's own *definitions* of its options (``disable_cuda_graph: bool = False`` in its ``ServerArgs`` body, the
class's own ``self.disable_cuda_graph``, ``add_argument(...)``) are neither listed nor rewritten. Without
``--rewrite-engine-options``, or where nothing is tied, the rule reports from the :mod:`ast` tree: reading another
engine's options must cost no libcst parse on a tree of thousands of files.
"""

from __future__ import annotations

import ast
import enum
from collections.abc import Iterable, Mapping, Sequence

import libcst as cst

from ..api_scan import ast_dotted_name
from ..renames import Rename, RenameKind, RenameTable
from .base import (
    ORIGINAL_KEY,
    REWRITE_ENGINE_OPTIONS_KEY,
    Finding,
    FindingKind,
    MigrationCommand,
    QuickView,
    dotted_name,
)
from .keywords import rewrite_keywords
from .module_names import Binding, Frame, ModuleNames
from .option_dicts import (
    ast_carriers,
    ast_dict_place,
    ast_imports_any,
    cst_carriers,
    cst_dict_place,
    cst_imports_any,
    one_for_one,
    rewrite_dict_place,
    splat_message,
)
from .owners import OWNER_METADATA, OwnerResolver, canonicalizer_for

__all__ = ["LegacyEngineOptions"]

SERVER_ARGS_NAMES = frozenset({"server_args"})
"""Receiver names listed even where no owner check ties them: SGLang passes its server arguments around unannotated."""


class Tie(enum.Enum):
    """How a receiver is tied to a legacy owner."""

    PROVEN = "proven"
    """An instance of a legacy owner (or the class itself), as far as the owner checks can tell."""
    BY_NAME = "by name"
    """Not proven to be an instance of a legacy owner, but named like SGLang's server arguments."""


def option_rows(table: RenameTable) -> dict[str, Rename]:
    """The ``kwarg`` rows that name legacy owners, by legacy option name."""
    return {row.old: row for row in table.of_kind(RenameKind.KWARG) if row.legacy_owners}


def option_packages(rows: Mapping[str, Rename]) -> frozenset[str]:
    """The top-level packages of the legacy owners (``sglang``): a file importing one is tied to that engine."""
    return frozenset(owner.split(".")[0] for row in rows.values() for owner in row.legacy_owners)


def option_owners(rows: Mapping[str, Rename]) -> frozenset[str]:
    """Every legacy owner of the rows (``ServerArgs``, ``Engine``)."""
    return frozenset(owner for row in rows.values() for owner in row.legacy_owners)


def attribute_message(receiver: str, row: Rename, tie: Tie) -> str:
    """What a read (or write) of ``receiver.<legacy option>`` is listed with: its spelling in ``cudagraph.config``."""
    if row.value is not None:
        spelled = f'cudagraph.config chooses by value: {row.old} -> {row.new} == "{row.value}"'
    elif row.also:
        spelled = f"cudagraph.config has one option per phase: {row.old} -> {' and '.join(row.targets)}"
    else:
        spelled = f"cudagraph.config spells it {row.new}"
    if tie is Tie.BY_NAME:
        tail = f"the type of {receiver} was not proven (listed by its name): move it by hand"
    elif one_for_one(row):
        tail = "--rewrite-engine-options rewrites it"
    else:
        tail = "not one name for one name: move it by hand"
    return f"{receiver}.{row.old}: {spelled}; {tail}"


def keyword_message(callee: str, rows: Sequence[Rename]) -> str:
    """What a call passing legacy options as keywords is listed with: each keyword's spelling in cudagraph.config."""
    spelled = []
    for row in rows:
        if row.value is not None:
            spelled.append(f'{row.old}=True as {row.new}="{row.value}"')
        else:
            spelled.append(f"{row.old}= as {' and '.join(f'{target}=' for target in row.targets)}")
    return f"{callee}(...): cudagraph.config spells {', '.join(spelled)}; --rewrite-engine-options rewrites them"


class LegacyEngineOptions(MigrationCommand):
    """List legacy options passed to or read from another engine's API; rewrite them with --rewrite-engine-options."""

    METADATA_DEPENDENCIES = OWNER_METADATA

    @classmethod
    def triggers(cls, table: RenameTable) -> frozenset[str]:
        """The legacy option names (keywords and attributes alike)."""
        return frozenset(option_rows(table))

    @classmethod
    def quick_findings(cls, view: QuickView) -> list[Finding] | None:
        """Report from :mod:`ast`; libcst only where ``--rewrite-engine-options`` has something to rewrite."""
        scan = OptionScan(view.tree, option_rows(view.table), cls.CODE, rewrite=view.rewrite_engine_options)
        scan.visit(view.tree)
        if view.rewrite_engine_options and scan.rewritable:
            return None
        return sorted(scan.findings, key=lambda finding: finding.line)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """Load the rows, then list or rewrite."""
        self.rows = option_rows(self.table)
        self.owners = OwnerResolver(self, canonicalizer_for(self))
        self.rewrite = bool(self.context.scratch.get(REWRITE_ENGINE_OPTIONS_KEY))
        original = self.context.scratch.get(ORIGINAL_KEY)
        # whether the file imports SGLang is a fact of the file as written, before CG101 moved its imports
        as_written = original[0] if isinstance(original, tuple) else tree
        self.sglang_file = cst_imports_any(as_written, option_packages(self.rows))
        self.option_tree = tree
        self._carriers: dict[str, set[str]] | None = None
        return super().transform_module_impl(tree)

    def visit_Import(self, node: cst.Import) -> bool:
        """Module paths in imports are CG101's."""
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        """Module paths in imports are CG101's."""
        return False

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        """A call of a legacy owner passing legacy options as keywords or in a splatted dict; a dict built or read
        with a legacy option key."""
        updated_node = self._owner_call(original_node, updated_node)
        if self.sglang_file:
            updated_node = self._dict_place(original_node, updated_node)  # type: ignore[assignment]
        return updated_node

    def leave_Dict(self, original_node: cst.Dict, updated_node: cst.Dict) -> cst.Dict:
        """A dict literal with a legacy option key."""
        return self._dict_place(original_node, updated_node) if self.sglang_file else updated_node  # type: ignore[return-value]

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> cst.Subscript:
        """``d["<option>"]``."""
        return self._dict_place(original_node, updated_node) if self.sglang_file else updated_node  # type: ignore[return-value]

    def _dict_place(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:
        place = cst_dict_place(original, self.rows)
        if place is None:
            return updated
        if not self.rewrite:
            self.candidate(original, place.message)
            return updated
        return rewrite_dict_place(self, original, updated, self.rows)

    def _owner_call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        self._splats(original_node)
        legacy = [
            self.rows[arg.keyword.value]
            for arg in original_node.args
            if arg.keyword is not None and arg.keyword.value in self.rows
        ]
        if not legacy:
            return updated_node
        owners = frozenset(owner for row in legacy for owner in row.legacy_owners)
        if not self.owners.class_types(original_node.func) & owners:
            return updated_node
        if not self.rewrite:
            self.candidate(original_node, keyword_message(_cst_label(original_node.func), legacy))
            return updated_node
        return rewrite_keywords(self, original_node, updated_node, self.rows)

    def _splats(self, call: cst.Call) -> None:
        """``ServerArgs(**d)`` where ``d`` is filled with legacy options in this file: listed (the places that fill
        it are rewritten where they stand, so with the flag there is nothing left to say here)."""
        if self.rewrite or not any(arg.star == "**" for arg in call.args):
            return
        if not self.owners.class_types(call.func) & option_owners(self.rows):
            return
        for arg in call.args:
            carrier = dotted_name(arg.value) if arg.star == "**" else None
            if carrier is None:
                continue
            if self._carriers is None:
                self._carriers = cst_carriers(self.option_tree, self.rows)
            if carrier in self._carriers:
                self.candidate(call, splat_message(_cst_label(call.func), carrier, self._carriers[carrier]))

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        """A legacy option read from (or written to) a receiver tied to a legacy owner."""
        row = self.rows.get(original_node.attr.value)
        if row is None:
            return updated_node
        tie = self._tie(original_node.value, frozenset(row.legacy_owners))
        if tie is None:
            return updated_node
        if tie is Tie.PROVEN and self.rewrite and one_for_one(row):
            self.edited()
            return updated_node.with_changes(attr=cst.Name(row.new))
        self.candidate(original_node, attribute_message(_cst_label(original_node.value), row, tie))
        return updated_node

    def _tie(self, receiver: cst.BaseExpression, owners: frozenset[str]) -> Tie | None:
        types = self.owners.instance_types(receiver)
        if (types is not None and types & owners) or self.owners.class_types(receiver) & owners:
            return Tie.PROVEN
        if not _cst_named_server_args(receiver):
            return None
        if isinstance(receiver, cst.Name) and self.owners.is_known(receiver):
            return None  # an imported module or a class of that name, not an instance
        return Tie.BY_NAME


def _cst_named_server_args(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.Name):
        return node.value in SERVER_ARGS_NAMES
    return isinstance(node, cst.Attribute) and node.attr.value in SERVER_ARGS_NAMES


def _cst_label(node: cst.BaseExpression) -> str:
    """How a receiver or callee is named in a finding (the same words as :func:`_ast_label`)."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_cst_label(node.value)}.{node.attr.value}"
    if isinstance(node, cst.Call):
        return f"{_cst_label(node.func)}(...)"
    return "(...)"


# --- the reporting half, over the ast tree -------------------------------------------------------------------------


class OptionScan(ast.NodeVisitor):
    """The findings of :class:`LegacyEngineOptions` read off an :mod:`ast` tree, and whether it would rewrite."""

    def __init__(self, tree: ast.Module, rows: Mapping[str, Rename], code: str, *, rewrite: bool = False) -> None:
        self.rows = rows
        self.code = code
        self.tree = tree
        self.rewrite = rewrite
        self.sglang_file = ast_imports_any(tree, option_packages(rows))
        """Whether the file imports SGLang: only then are dicts with legacy option keys its options."""
        self._carriers: dict[str, set[str]] | None = None
        self.names = ModuleNames(tree)
        self.frames: list[Frame] = [self.names.frame(tree.body)]
        self.methods_of: list[ast.ClassDef | None] = [None]
        """The class whose method is being visited (innermost last; None outside a method)."""
        self.findings: list[Finding] = []
        self.rewritable = False
        """Whether ``--rewrite-engine-options`` would rewrite something here (a tied call, a tied one-name read)."""

    def visit_Import(self, node: ast.Import) -> None:
        """Nothing to see in imports."""

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        """Nothing to see in imports."""

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        """Its bases outside, its body in its own scope (which its methods do not see)."""
        self._visit_all([*node.decorator_list, *node.bases, *(keyword.value for keyword in node.keywords)])
        self.frames.append(self.names.frame(node.body, is_class=True))
        for statement in node.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._function(statement, node)
            else:
                self.visit(statement)
        self.frames.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """A function outside a class body."""
        self._function(node, None)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        """Its parameters are of unknown type."""
        self._visit_all([*node.args.defaults, *(default for default in node.args.kw_defaults if default)])
        frame = Frame()
        arguments = node.args
        for parameter in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg]:
            if parameter is not None:
                frame.bindings[parameter.arg].append(Binding(None))
        if arguments.kwarg is not None:
            frame.bindings[arguments.kwarg.arg].append(Binding(None))
        self.frames.append(frame)
        self.visit(node.body)
        self.frames.pop()

    def visit_Dict(self, node: ast.Dict) -> None:
        """A dict literal with a legacy option key."""
        self._dict_place(node)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        """``d["<option>"]``."""
        self._dict_place(node)
        self.generic_visit(node)

    def _dict_place(self, node: ast.expr) -> None:
        if not self.sglang_file:
            return
        place = ast_dict_place(node, self.rows)
        if place is not None:
            self.rewritable |= place.rewritable
            if not (self.rewrite and place.rewritable):
                self._report(node, place.message)

    def _splats(self, node: ast.Call) -> None:
        """``ServerArgs(**d)`` where ``d`` is filled with legacy options in this file (see the libcst pass)."""
        if self.rewrite or not any(keyword.arg is None for keyword in node.keywords):
            return
        if not self.names.class_types(node.func) & option_owners(self.rows):
            return
        for keyword in node.keywords:
            carrier = ast_dotted_name(keyword.value) if keyword.arg is None else None
            if carrier is None:
                continue
            if self._carriers is None:
                self._carriers = ast_carriers(self.tree, self.rows)
            if carrier in self._carriers:
                self._report(node, splat_message(_ast_label(node.func), carrier, self._carriers[carrier]))

    def visit_Call(self, node: ast.Call) -> None:
        """A call of a legacy owner passing legacy options as keywords or in a splatted dict; a dict built or read
        with a legacy option key."""
        self._splats(node)
        self._dict_place(node)
        named = [keyword.arg for keyword in node.keywords if keyword.arg is not None]
        legacy = [self.rows[name] for name in named if name in self.rows]
        if legacy:
            owners = frozenset(owner for row in legacy for owner in row.legacy_owners)
            if self.names.class_types(node.func) & owners:
                self.rewritable = True
                self._report(node, keyword_message(_ast_label(node.func), legacy))
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        """A legacy option read from (or written to) a receiver tied to a legacy owner."""
        row = self.rows.get(node.attr)
        if row is not None:
            tie = self._tie(node.value, frozenset(row.legacy_owners))
            if tie is not None:
                self.rewritable |= tie is Tie.PROVEN and one_for_one(row)
                self._report(node, attribute_message(_ast_label(node.value), row, tie))
        self.generic_visit(node)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, owner: ast.ClassDef | None) -> None:
        arguments = node.args
        outside = [*node.decorator_list, *arguments.defaults, *(value for value in arguments.kw_defaults if value)]
        self._visit_all(outside)
        self.frames.append(self.names.function_frame(node, owner))
        self.methods_of.append(owner)
        self._visit_all(node.body)
        self.methods_of.pop()
        self.frames.pop()

    def _visit_all(self, nodes: Iterable[ast.AST]) -> None:
        for node in nodes:
            self.visit(node)

    def _report(self, node: ast.expr, message: str) -> None:
        self.findings.append(Finding(FindingKind.ARGV, self.code, node.lineno, message))

    def _tie(self, receiver: ast.expr, owners: frozenset[str]) -> Tie | None:
        types = self._instance_types(receiver)
        if (types is not None and types & owners) or self.names.class_types(receiver) & owners:
            return Tie.PROVEN
        if not _ast_named_server_args(receiver):
            return None
        if isinstance(receiver, ast.Name) and self._is_defined(receiver.id):
            return None  # an imported module or a class of that name, not an instance
        return Tie.BY_NAME

    def _instance_types(self, node: ast.expr) -> frozenset[str] | None:
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id == "super":
                owner = self.methods_of[-1]
                return self.names.ancestors(owner) if owner is not None else None
            return self.names.class_types(node.func)
        if not isinstance(node, ast.Name):
            return None
        bindings = self._bindings(node.id)
        if not bindings or any(binding.defines or binding.types is None for binding in bindings):
            return None
        return frozenset(name for binding in bindings for name in binding.types or ())

    def _is_defined(self, name: str) -> bool:
        bindings = self._bindings(name)
        return bool(bindings) and all(binding.defines for binding in bindings)

    def _bindings(self, name: str) -> list[Binding]:
        """The bindings of ``name`` in the innermost scope that binds it (class bodies are not seen from inside
        their methods)."""
        for frame in reversed(self.frames):
            if frame.is_class and frame is not self.frames[-1]:
                continue
            if name in frame.bindings:
                return frame.bindings[name]
        return []


def _ast_named_server_args(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in SERVER_ARGS_NAMES
    return isinstance(node, ast.Attribute) and node.attr in SERVER_ARGS_NAMES


def _ast_label(node: ast.expr) -> str:
    """How a receiver or callee is named in a finding (the same words as :func:`_cst_label`)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_ast_label(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return f"{_ast_label(node.func)}(...)"
    return "(...)"
