"""The rules' libcst metadata (``cudagraph.migrate.metadata``) is libcst's own, computed without its idle walks; the
walks the rules make themselves go no further than they need.

Every fixture source, and the plugin corpus, is resolved twice on the same parsed tree: once by libcst, once by
:func:`resolve_many`; the results must agree node for node. Scopes are compared by what the rules read of them
(assignments, references, qualified names), since each resolution builds its own scope objects.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import libcst as cst
import pytest
from libcst.codemod import CodemodContext
from libcst.metadata import (
    BuiltinScope,
    ExpressionContextProvider,
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    Scope,
    ScopeProvider,
)

from cudagraph.migrate.metadata import parent_nodes, resolve_many
from cudagraph.migrate.reexports import import_statements
from cudagraph.migrate.renames import load_renames
from cudagraph.migrate.rules.imports import LegacyImports

from .fixture_cases import fixture_texts


def _parses(text: str) -> bool:
    try:
        ast.parse(text)
    except SyntaxError:
        return False
    return True


PLUGINS = Path(__file__).parent / "plugins"
TEXTS = {
    **fixture_texts(),
    **{str(path.relative_to(PLUGINS.parent)): path.read_text() for path in sorted(PLUGINS.rglob("*.py"))},
}
"""Every fixture input and expected output, and every plugin file, by name."""
SOURCES = sorted(name for name, text in TEXTS.items() if _parses(text))


def _parsed(name: str) -> cst.Module:
    return cst.parse_module(TEXTS[name])


@pytest.mark.parametrize("name", SOURCES)
def test_parents_are_libcsts(name: str) -> None:
    module = _parsed(name)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ParentNodeProvider)
    found = parent_nodes(module)
    assert found.keys() == expected.keys()
    assert all(found[node] is parent for node, parent in expected.items())


@pytest.mark.parametrize("name", SOURCES)
def test_resolved_metadata_is_libcsts(name: str) -> None:
    module = _parsed(name)
    providers = (ExpressionContextProvider, PositionProvider, ScopeProvider, ParentNodeProvider)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve_many(providers)
    found = resolve_many(MetadataWrapper(module, unsafe_skip_copy=True), providers)
    assert dict(found[ExpressionContextProvider]) == dict(expected[ExpressionContextProvider])
    assert dict(found[PositionProvider]) == dict(expected[PositionProvider])
    assert dict(found[ParentNodeProvider]) == dict(expected[ParentNodeProvider])
    in_tree = {module, *parent_nodes(module)}  # not the nodes each analysis parses out of string annotations
    assert _scopes(found[ScopeProvider], in_tree) == _scopes(expected[ScopeProvider], in_tree)


@pytest.mark.parametrize("name", SOURCES)
def test_qualified_names_asked_of_the_scope_are_the_providers(name: str) -> None:
    """What ``OwnerResolver.qualified_names`` asks of a node's scope is what ``QualifiedNameProvider`` provides."""
    wrapper = MetadataWrapper(_parsed(name), unsafe_skip_copy=True)
    provided = wrapper.resolve(QualifiedNameProvider)
    scopes = wrapper.resolve(ScopeProvider)
    for node in parent_nodes(wrapper.module):
        scope = scopes.get(node)
        asked = scope.get_qualified_names_for(node) if scope is not None else set()
        value = provided.get(node, set())
        assert asked == (value() if callable(value) else value), cst.Module([]).code_for_node(node)  # a LazyValue


def test_no_batched_walk_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """libcst's batched visit over the whole tree is what :func:`resolve_many` saves; it must not happen."""

    def walked(*args: object, **kwargs: object) -> None:
        raise AssertionError("a batched walk over the tree")

    monkeypatch.setattr(MetadataWrapper, "visit_batched", walked)
    wrapper = MetadataWrapper(_parsed(SOURCES[0]), unsafe_skip_copy=True)
    resolved = resolve_many(wrapper, (ScopeProvider, ParentNodeProvider, PositionProvider))
    assert resolved[ScopeProvider]
    assert wrapper.resolve(ExpressionContextProvider) is not None  # stored on the way, found without a walk


def test_nothing_is_resolved_twice() -> None:
    wrapper = MetadataWrapper(_parsed(SOURCES[0]), unsafe_skip_copy=True)
    first = resolve_many(wrapper, (ScopeProvider,))[ScopeProvider]
    assert resolve_many(wrapper, (ScopeProvider, ParentNodeProvider))[ScopeProvider] is first


@pytest.mark.parametrize("name", SOURCES)
def test_import_statements_are_every_import(name: str) -> None:
    tree = ast.parse(TEXTS[name])
    expected = {id(node) for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))}
    assert {id(node) for node in import_statements(tree)} == expected


def _scopes(scopes: Mapping[cst.CSTNode, object], nodes: set[cst.CSTNode]) -> dict[int, object]:
    """Per node of ``nodes`` (by id): what the rules read of its scope and of the scopes around it."""
    described: dict[int, object] = {}
    return {id(node): _described(scope, described) for node, scope in scopes.items() if node in nodes}


def _described(scope: object, described: dict[int, object]) -> object:
    """A scope as the rules read it: its kind, its node, its assignments with their references, and its parent's."""
    if not isinstance(scope, Scope):
        return scope
    if isinstance(scope, BuiltinScope):
        return "builtins"
    if id(scope) not in described:
        assignments = sorted(
            (
                assignment.name,
                type(assignment).__name__,
                id(getattr(assignment, "node", None)),
                tuple(sorted(id(access.node) for access in assignment.references)),
            )
            for assignment in scope.assignments
        )
        parent = _described(scope.parent, described) if scope.parent is not scope else None
        described[id(scope)] = (type(scope).__name__, id(getattr(scope, "node", None)), assignments, parent)
    return described[id(scope)]


def test_the_import_rule_rebuilds_only_the_way_to_its_rewrites() -> None:
    """CG101 visits only the statements that lead to a rewrite; the rest of the tree is handed on as it was."""
    source = (
        "from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner\n\n\n"
        "def untouched(values):\n    return [value * 2 for value in values]\n\n\n"
        "def uses(model_runner, config):\n    return CudaGraphRunner(model_runner, config)\n"
    )
    tree = cst.parse_module(source)
    command = LegacyImports(CodemodContext(filename="pkg/mod.py", scratch={}), load_renames())
    result = command.transform_module(tree)
    assert result.code == source.replace(
        "from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner",
        "from cudagraph.runner import DecodeCudaGraphRunner",
    ).replace("return CudaGraphRunner", "return DecodeCudaGraphRunner")
    assert result.body[1] is tree.body[1]
    assert result.body[2] is not tree.body[2]
