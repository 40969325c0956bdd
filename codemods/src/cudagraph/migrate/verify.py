"""The post-condition on every file the codemods write: it parses, and every ``cudagraph`` name it newly imports
resolves against the exports manifest.

Read with :mod:`ast` (the C parser), independently of the libcst rules that produced the text, so a rule bug cannot
vouch for itself. Only references the migration added are checked: a name the file already imported before is the
user's business, not something the migration broke.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from .exports import ExportsManifest
from .python_ast import parse_ast

__all__ = ["CudagraphReference", "cudagraph_references", "unresolved_references"]

_ROOT = "cudagraph"


@dataclass(frozen=True, order=True)
class CudagraphReference:
    """``from module import name`` (or ``module.name`` through a module binding); ``name`` None: ``import module``."""

    module: str
    name: str | None
    line: int = 0

    @property
    def key(self) -> tuple[str, str | None]:
        """The reference without its line, to compare before and after."""
        return self.module, self.name

    def spelled(self) -> str:
        """How the reference reads in code."""
        return self.module if self.name is None else f"{self.module}.{self.name}"


def cudagraph_references(source: bytes | str | ast.Module, filename: str = "<migrated>") -> list[CudagraphReference]:
    """Every import of a ``cudagraph`` module or name in ``source`` (a text, or its :mod:`ast` tree), and every
    ``binding.Name`` through such a module.

    Raises :class:`SyntaxError` when ``source`` does not parse.
    """
    tree = source if isinstance(source, ast.Module) else parse_ast(source, filename=filename)
    references: list[CudagraphReference] = []
    module_bindings: dict[str, str] = {}
    attributes: list[ast.Attribute] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            attributes.append(node)  # read once every binding is known
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_ours(node.module):
            assert node.module is not None
            for alias in node.names:
                if alias.name == "*":
                    references.append(CudagraphReference(node.module, None, node.lineno))
                    continue
                references.append(CudagraphReference(node.module, alias.name, node.lineno))
                module_bindings[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _is_ours(alias.name):
                    references.append(CudagraphReference(alias.name, None, node.lineno))
                    if alias.asname:
                        module_bindings[alias.asname] = alias.name
    for attribute in attributes:
        chain = _dotted(attribute)
        if chain is not None:
            references.extend(_through_binding(chain, module_bindings, attribute.lineno))
    return references


def unresolved_references(
    original: bytes | str | ast.Module,
    migrated: bytes | str,
    exports: ExportsManifest,
    filename: str = "<migrated>",
) -> list[CudagraphReference]:
    """References ``migrated`` adds over ``original`` (a text, or its :mod:`ast` tree when the caller has it) that do
    not resolve (raises SyntaxError if ``migrated`` does not parse)."""
    try:
        before = {reference.key for reference in cudagraph_references(original, filename)}
    except SyntaxError:
        before = set()
    return sorted(
        reference
        for reference in cudagraph_references(migrated, filename)
        if reference.key not in before and not _resolves(reference, exports)
    )


def _resolves(reference: CudagraphReference, exports: ExportsManifest) -> bool:
    if reference.name is None:
        return exports.has_module(reference.module)
    return exports.exports(reference.module, reference.name)


def _is_ours(module: str | None) -> bool:
    return module is not None and (module == _ROOT or module.startswith(_ROOT + "."))


def _dotted(node: ast.expr) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _through_binding(chain: list[str], bindings: dict[str, str], line: int) -> list[CudagraphReference]:
    """``m.Name`` where ``m`` is bound to a cudagraph module, or ``cudagraph.mod.Name`` spelled out in full."""
    head, rest = chain[0], chain[1:]
    if head in bindings and rest:
        target = bindings[head]
        if target.count(".") == 1:  # bound to a public module, e.g. import cudagraph.runner as r
            return [CudagraphReference(target, rest[0], line)]
        return []
    if head == _ROOT and len(chain) >= 3:
        return [CudagraphReference(f"{_ROOT}.{chain[1]}", chain[2], line)]
    return []
