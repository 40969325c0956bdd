"""Names a project re-exports from the legacy API, learnt before the rules run, so a use in another file is tied too.

``toy_engine/server_args.py`` imports ``Backend`` from ``cudagraph.legacy.server_args``; a test importing
``from toy_engine.server_args import Backend`` then holds the legacy API's ``Backend`` although its own file never
names a legacy module. One cheap pass over the files the prefilter keeps (:mod:`ast`, module-level imports only) maps
``toy_engine.server_args.Backend`` to ``cudagraph.config.Backend``; the owner checks of the scoped rules consult it.
Only names that move are recorded: a name that stays on its legacy import is not the new API's.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from .exports import ExportsManifest
from .python_ast import parse_ast
from .renames import RenameTable

__all__ = ["collect_reexports", "import_statements", "imported_names", "module_names"]


def module_names(path: Path, roots: Sequence[Path]) -> list[str]:
    """The dotted names ``path`` may be imported as: relative to each root it is under, with and without the root's
    own package name (``pkg/a/b.py`` under root ``pkg``: ``a.b`` and ``pkg.a.b``)."""
    names: list[str] = []
    for root in roots:
        try:
            relative = path.resolve().relative_to(root.resolve())
        except ValueError:
            continue
        parts = list(relative.with_suffix("").parts)
        if parts and parts[-1] == "__init__":
            parts.pop()
        if parts:
            names.append(".".join(parts))
        if (root / "__init__.py").is_file():
            names.append(".".join([root.resolve().name, *parts]))
    return names


def collect_reexports(
    files: Iterable[Path], roots: Sequence[Path], table: RenameTable, exports: ExportsManifest
) -> dict[str, str]:
    """``importing.module.Name -> new.module.NewName`` for module-level imports of moving legacy names."""
    legacy_modules = tuple(table.modules)
    found: dict[str, str] = {}
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if not any(module in text for module in legacy_modules):
            continue
        try:
            tree = parse_ast(text, filename=str(path))
        except SyntaxError:
            continue
        bindings = dict(_module_level_bindings(tree.body, table, exports))
        for name in module_names(path, roots):
            for local, target in bindings.items():
                found[f"{name}.{local}"] = target
    return found


def _module_level_bindings(
    body: Sequence[ast.stmt], table: RenameTable, exports: ExportsManifest
) -> Iterable[tuple[str, str]]:
    for statement in body:
        if isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module in table.modules:
            row = table.modules[str(statement.module)]
            for alias in statement.names:
                symbol = table.symbol(row.old, alias.name)
                if symbol is not None:
                    yield alias.asname or alias.name, symbol.new
                elif exports.exports(row.new, alias.name):
                    yield alias.asname or alias.name, f"{row.new}.{alias.name}"
        elif isinstance(statement, (ast.If, ast.Try)):
            yield from _module_level_bindings(statement.body, table, exports)


def imported_names(tree: ast.Module, canonical: Callable[[str], str]) -> frozenset[str]:
    """Canonical qualified names a file imports: ``module.Name`` of every from-import, and every imported module."""
    found: set[str] = set()
    for node in import_statements(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            found.add(node.module)
            found.update(canonical(f"{node.module}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return frozenset(found)


_STATEMENT_LISTS = ("body", "orelse", "finalbody", "handlers", "cases")
"""The fields of statements (and of ``except`` clauses and ``case`` blocks) that hold statements."""


def import_statements(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree`` at any depth, in no particular order.

    An import is a statement, never part of an expression, so only statement lists are walked: a fraction of what
    :func:`ast.walk` costs over every expression of a large file.
    """
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        for field in _STATEMENT_LISTS:
            pending.extend(getattr(node, field, ()))
