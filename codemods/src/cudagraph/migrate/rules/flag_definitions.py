"""Which flag definitions belong to SGLang's parser, for CG402: only those get the advice to use
``cudagraph.config.add_cli_args``.

A definition of a legacy flag (``parser.add_argument("--cuda-graph-max-bs", ...)``) is never rewritten. Where the
parser is SGLang's server parser, the definition is one that moving to cudagraph replaces, so it is listed for review
with that advice; another engine's own parser defining a flag of the same name is that engine's business, and its
definition is only listed with ``-v`` as not tied. A definition is tied to SGLang's ``ServerArgs`` (the
``legacy_owners`` of the ``kwarg`` rows) when it stands

- in ``add_cli_args`` of a class that is, or derives from, one of those owners (SGLang's own
  ``ServerArgs.add_cli_args`` in ``sglang/srt/server_args.py``, or a subclass's override), or
- in a function that hands the same parser to ``ServerArgs.add_cli_args(parser)``.

The decision is read from the :mod:`ast` tree, keyed by the enclosing scopes' names and the parser's dotted name, so
the libcst pass (``--rewrite-argv``) asks the same question of the same key.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import PurePath

from ..api_scan import ast_dotted_name
from ..renames import RenameKind, RenameTable
from .module_names import ModuleNames

__all__ = ["ANY_PARSER", "DefinitionTies", "parser_owners"]

ANY_PARSER = "*"
"""The parser part of a key that ties every definition in a scope (``add_cli_args`` of a tied class)."""

_CLI_ARGS_HOOK = "add_cli_args"


def parser_owners(table: RenameTable) -> frozenset[str]:
    """SGLang's classes whose ``add_cli_args`` defines its flags: the ``legacy_owners`` of the ``kwarg`` rows."""
    return frozenset(owner for row in table.of_kind(RenameKind.KWARG) for owner in row.legacy_owners)


class DefinitionTies(ast.NodeVisitor):
    """The ``(scope names, parser)`` keys whose flag definitions are SGLang's, read off one file's :mod:`ast` tree."""

    def __init__(self, tree: ast.Module, path: str, owners: Iterable[str]) -> None:
        self.owners = frozenset(owners)
        self.names = ModuleNames(tree)
        parts = PurePath(path).with_suffix("").parts
        self.defined_here = frozenset(
            owner for owner in self.owners if _ends_with(parts, owner.rpartition(".")[0].split("."))
        )
        """Owners this very file defines (SGLang's own ``server_args.py``), by qualified name."""
        self.scopes: list[str] = []
        self.classes: list[ast.ClassDef | None] = [None]
        self.tied: set[tuple[tuple[str, ...], str]] = set()
        self.visit(tree)

    def ties(self, scopes: tuple[str, ...], parser: str | None) -> bool:
        """Whether a definition on ``parser`` (its dotted name, None: not a name) inside ``scopes`` is SGLang's."""
        return (scopes, ANY_PARSER) in self.tied or (parser is not None and (scopes, parser) in self.tied)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        """A class's body is a scope of its own."""
        self.scopes.append(node.name)
        self.classes.append(node)
        self.generic_visit(node)
        self.classes.pop()
        self.scopes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """``add_cli_args`` of a tied class ties every definition in it."""
        owner = self.classes[-1]
        self.scopes.append(node.name)
        self.classes.append(None)
        if owner is not None and node.name == _CLI_ARGS_HOOK and self._is_tied_class(owner):
            self.tied.add((tuple(self.scopes), ANY_PARSER))
        self.generic_visit(node)
        self.classes.pop()
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        """``ServerArgs.add_cli_args(parser)`` ties the definitions on ``parser`` in this scope."""
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == _CLI_ARGS_HOOK and node.args:
            parser = ast_dotted_name(node.args[0])
            if parser is not None and self.names.class_types(func.value) & self.owners:
                self.tied.add((tuple(self.scopes), parser))
        self.generic_visit(node)

    def _is_tied_class(self, class_def: ast.ClassDef) -> bool:
        if any(owner.rpartition(".")[2] == class_def.name for owner in self.defined_here):
            return True
        return bool(self.names.ancestors(class_def) & self.owners)


def _ends_with(parts: tuple[str, ...], tail: list[str]) -> bool:
    return len(parts) >= len(tail) and list(parts[len(parts) - len(tail) :]) == tail
