"""libcst metadata of a whole module, computed without the walks over the tree that compute nothing.

libcst computes a batchable provider (``ScopeProvider``, ``ExpressionContextProvider``, ``ParentNodeProvider``, ...)
by walking the whole tree with a batched visitor that calls the provider's ``visit_`` methods; a walk visits and
rebuilds every node of the tree, and costs as much as a rewrite. Those providers do all their work in
``visit_Module`` (each walks the tree with a visitor of its own), so the batched walk then visits the rest of the
tree for nothing, and libcst walks it once more for a round of dependencies without a batchable provider (a
``PositionProvider`` alone): about a third of CG101's time on SGLang 0.5.13. Here

- a batchable provider whose only visit method is ``visit_Module`` has it called directly, on the wrapper's module;
- a non-batchable one is generated alone, as libcst does, without the empty walk;
- ``ParentNodeProvider`` is computed from the nodes' fields (:func:`parent_nodes`), without rebuilding the tree;

and the result is stored in the wrapper the way libcst stores it, so ``MetadataWrapper.resolve`` and
``MetadataDependent.resolve`` find it and nothing is computed twice. Any other provider (one with other visit
methods, one that needs a repository cache) goes through libcst.

This reads private attributes of libcst (``MetadataWrapper._metadata``, ``BaseMetadataProvider._computed`` and
``_gen``), as libcst's own resolver does; tests compare every result with libcst's resolution.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType

import libcst as cst
from libcst.metadata import (
    BatchableMetadataProvider,
    CodeRange,
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    ProviderT,
)

__all__ = ["parent_nodes", "parents", "positions", "resolve_many", "resolved"]

Metadata = Mapping[ProviderT, Mapping[cst.CSTNode, object]]


def resolve_many(wrapper: MetadataWrapper, providers: Collection[ProviderT]) -> Metadata:
    """``wrapper.resolve_many(providers)``: the metadata of ``providers`` for ``wrapper.module`` (their dependencies
    are computed and stored in ``wrapper`` too), without libcst's walks that compute nothing."""
    for provider in providers:
        _resolve(wrapper, provider)
    return wrapper.resolve_many(providers)  # everything is stored by now: this only reads


def parents(wrapper: MetadataWrapper) -> Mapping[cst.CSTNode, cst.CSTNode]:
    """``ParentNodeProvider``'s metadata of ``wrapper.module``: each node's parent (the module has none)."""
    return resolve_many(wrapper, (ParentNodeProvider,))[ParentNodeProvider]  # type: ignore[return-value]


def positions(wrapper: MetadataWrapper) -> Mapping[cst.CSTNode, CodeRange]:
    """``PositionProvider``'s metadata of ``wrapper.module``: where each node's code starts and ends."""
    return resolve_many(wrapper, (PositionProvider,))[PositionProvider]  # type: ignore[return-value]


@contextmanager
def resolved(command: cst.MetadataDependent, wrapper: MetadataWrapper) -> Iterator[None]:
    """``command.resolve(wrapper)``: the metadata ``command`` declares, for its ``get_metadata``, while inside.

    Each provider is computed on the first read of its metadata, not before the visit: a rule that declares
    ``ScopeProvider`` but, in a given file, decides everything without it (a legacy import that stays for a reason
    of its own, a file whose names all move unchanged) spares the scope analysis, which is most of the time of a
    file it transforms. What is computed is stored in ``wrapper``, so later rules on the same tree reuse it.
    """
    command.metadata = _OnFirstRead(wrapper, command.get_inherited_dependencies())
    try:
        yield
    finally:
        command.metadata = {}


class _OnFirstRead(dict):  # type: ignore[type-arg]
    """The metadata of ``providers`` for a wrapper's module, each resolved when first read (``metadata[provider]``),
    as libcst's ``get_metadata`` reads it."""

    def __init__(self, wrapper: MetadataWrapper, providers: Collection[ProviderT]) -> None:
        super().__init__()
        self._wrapper = wrapper
        self._providers = frozenset(providers)

    def __contains__(self, provider: object) -> bool:
        return provider in self._providers

    def __missing__(self, provider: ProviderT) -> Mapping[cst.CSTNode, object]:
        if provider not in self._providers:
            raise KeyError(provider)
        computed = resolve_many(self._wrapper, (provider,))[provider]
        self[provider] = computed
        return computed


def parent_nodes(module: cst.Module) -> dict[cst.CSTNode, cst.CSTNode]:
    """Each node of ``module`` below it, mapped to its parent: what ``ParentNodeProvider`` computes, read off the
    nodes' fields instead of a visit (which rebuilds every node and costs several times as much)."""
    found: dict[cst.CSTNode, cst.CSTNode] = {}
    stack: list[cst.CSTNode] = [module]
    while stack:
        node = stack.pop()
        for name in _node_fields(type(node)):
            value = getattr(node, name)
            kind = type(value)
            if kind is tuple or kind is list:
                for item in value:
                    if _is_node_type(type(item)):
                        found[item] = node
                        stack.append(item)
            elif _is_node_type(kind):
                found[value] = node
                stack.append(value)
    return found


@functools.cache
def _node_fields(node_type: type[cst.CSTNode]) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(node_type))


_NODE_TYPES: dict[type, bool] = {}


def _is_node_type(kind: type) -> bool:
    """``issubclass(kind, CSTNode)``, remembered: an ``isinstance`` against libcst's abstract base costs several
    times a lookup, on every field of every node."""
    known = _NODE_TYPES.get(kind)
    if known is None:
        known = _NODE_TYPES[kind] = issubclass(kind, cst.CSTNode)
    return known


def _resolve(wrapper: MetadataWrapper, provider: ProviderT) -> None:
    """Store ``provider``'s metadata in ``wrapper`` unless it is there; dependencies first."""
    if provider in wrapper._metadata:
        return
    if provider is ParentNodeProvider:
        wrapper._metadata[provider] = MappingProxyType(parent_nodes(wrapper.module))
        return
    if provider.gen_cache is not None or not _works_alone(provider):
        wrapper.resolve(provider)
        return
    for dependency in provider.METADATA_DEPENDENCIES:
        _resolve(wrapper, dependency)
    instance = provider()
    if not isinstance(instance, BatchableMetadataProvider):
        wrapper._metadata[provider] = instance._gen(wrapper)
        return
    with instance.resolve(wrapper):  # its dependencies, stored above
        instance.visit_Module(wrapper.module)  # type: ignore[attr-defined]
    wrapper._metadata[provider] = MappingProxyType(dict(instance._computed))


@functools.cache
def _works_alone(provider: ProviderT) -> bool:
    """Whether ``provider`` computes everything in one call: a non-batchable provider (``_gen``), or a batchable one
    whose only visit method is ``visit_Module`` (the batched walk over the rest of the tree would call nothing)."""
    if not issubclass(provider, BatchableMetadataProvider):
        return True
    return set(provider().get_visitors()) == {"visit_Module"}
