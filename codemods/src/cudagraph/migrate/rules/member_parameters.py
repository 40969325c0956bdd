"""What a renamed method's parameters need beyond the new name: CG201's helpers for the rows that say so.

A method row's ``parameters`` (``capture_one_shape(shape)`` is ``capture_bucket(bucket)``) rename a tied call's
keyword argument and an override's parameter, with every use of that parameter in the override's body (by libcst's
scope analysis: an attribute ``x.shape``, a keyword ``f(shape=...)`` of another call and a nested function's own
``shape`` are other names). An override whose body already spells the new name keeps the old parameter: renaming it
there would change what that name means.

Where the new method takes as optional an argument the old one required (``replay_routed(batch, route)`` became
``replay(batch, route=None)``, and callers of the new name may leave ``route`` out), a renamed override takes the
parameter as optional too and first looks the value up as the runner does (:data:`LOOKED_UP_WHEN_MISSING`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import Assignment, ScopeProvider

__all__ = [
    "LOOKED_UP_WHEN_MISSING",
    "LookedUpWhenMissing",
    "ParameterRenames",
    "keywords_renamed",
    "parameter_renames",
    "with_optional_lookup",
]


@dataclass(frozen=True)
class LookedUpWhenMissing:
    """An argument the old method required that the new one looks up when the caller leaves it out."""

    old_method: str
    """The old method name (its row's ``old``)."""
    position: int
    """The parameter's position after ``self``."""
    lookup: str
    """The expression that finds the value: ``{self}`` and ``{0}``, ``{1}``, ... name the override's ``self`` and
    its parameters after it, as the override spells them."""


LOOKED_UP_WHEN_MISSING: Mapping[str, LookedUpWhenMissing] = {
    lookup.old_method: lookup
    for lookup in (
        LookedUpWhenMissing("replay_routed", 1, "{0}.route if {0}.route is not None else {self}.route({0})"),
    )
}
"""By old method name: the routing ``replay`` does for a step that brings no route (the batch's own, else looked
up), which a ``replay_routed`` override never had to do."""


@dataclass(frozen=True)
class ParameterRenames:
    """The renames of one override's parameters: the new spelling of each :class:`cst.Name` by its node's id."""

    by_node: Mapping[int, str]
    kept: tuple[tuple[str, str], ...] = ()
    """``(old, new)`` parameters left as they were because the function already uses the new name."""


def parameter_renames(
    command: cst.MetadataDependent, function: cst.FunctionDef, parameters: Mapping[str, str]
) -> ParameterRenames:
    """The names in ``function`` (an override being renamed) to respell for ``parameters`` (legacy = new).

    ``command`` is the running rule, which declares :class:`ScopeProvider` among its metadata dependencies.
    """
    by_node: dict[int, str] = {}
    kept: list[tuple[str, str]] = []
    spelled = _names_used(function)
    for param in _all_params(function.params):
        new = parameters.get(param.name.value)
        if new is None:
            continue
        scope = command.get_metadata(ScopeProvider, param.name, None)
        nodes = _binding_names(scope, param) if scope is not None else None
        if new in spelled or nodes is None:
            kept.append((param.name.value, new))
            continue
        by_node.update((id(node), new) for node in nodes)
    return ParameterRenames(by_node, tuple(kept))


def _binding_names(scope: object, param: cst.Param) -> list[cst.Name] | None:
    """The parameter's name node and every name that reads or rebinds it in its scope (None: something else does)."""
    name = param.name.value
    assignments = list(scope.assignments[name]) if name in scope.assignments else []  # type: ignore[attr-defined]
    if not any(isinstance(assignment, Assignment) and assignment.node is param for assignment in assignments):
        return None
    nodes: list[cst.Name] = [param.name]
    for assignment in assignments:
        if isinstance(assignment, Assignment) and assignment.node is not param:
            if not isinstance(assignment.node, cst.Name):
                return None  # bound by an import, a class, a def: leave the parameter as it is
            nodes.append(assignment.node)
        for access in assignment.references:
            if not isinstance(access.node, cst.Name):
                return None  # read from a string annotation or the like
            nodes.append(access.node)
    return nodes


def keywords_renamed(call: cst.Call, parameters: Mapping[str, str]) -> cst.Call:
    """``call`` with each keyword argument of ``parameters`` respelled (the call of a renamed method)."""
    args = [
        arg.with_changes(keyword=arg.keyword.with_changes(value=parameters[arg.keyword.value]))
        if arg.keyword is not None and arg.keyword.value in parameters
        else arg
        for arg in call.args
    ]
    return call.with_changes(args=args)


def with_optional_lookup(function: cst.FunctionDef, lookup: LookedUpWhenMissing) -> cst.FunctionDef | None:
    """``function`` (an override of ``lookup.old_method``) taking the parameter as optional and looking it up when
    missing; None where its parameters do not allow it (no ``self``, too few positional parameters, a required one
    after it). An override that already has a default for it is returned as it is."""
    positional = [*function.params.posonly_params, *function.params.params]
    if len(positional) <= lookup.position + 1:
        return None
    param = positional[lookup.position + 1]
    if param.default is not None:
        return function
    if any(later.default is None for later in positional[lookup.position + 2 :]):
        return None
    names = [item.name.value for item in positional[1:]]
    expression = lookup.lookup.format(*names, self=positional[0].name.value)
    prelude = cst.parse_statement(f"if {param.name.value} is None:\n    {param.name.value} = {expression}\n")
    annotation = param.annotation
    if annotation is not None and not _is_optional(annotation.annotation):
        optional = cst.BinaryOperation(annotation.annotation, cst.BitOr(), cst.Name("None"))
        annotation = annotation.with_changes(annotation=optional)
    equal = cst.AssignEqual() if annotation is not None else _TIGHT_EQUAL
    optional_param = param.with_changes(annotation=annotation, equal=equal, default=cst.Name("None"))
    params = _replace_param(function.params, param, optional_param)
    body = function.body
    if not isinstance(body, cst.IndentedBlock):
        return None
    statements = list(body.body)
    at = 1 if statements and _is_docstring(statements[0]) else 0
    statements.insert(at, prelude)
    return function.with_changes(params=params, body=body.with_changes(body=statements))


_TIGHT_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
"""``route=None``: the spelling of a default without an annotation."""


def _replace_param(params: cst.Parameters, old: cst.Param, new: cst.Param) -> cst.Parameters:
    return params.with_changes(
        posonly_params=[new if item is old else item for item in params.posonly_params],
        params=[new if item is old else item for item in params.params],
    )


def _is_optional(annotation: cst.BaseExpression) -> bool:
    if isinstance(annotation, cst.BinaryOperation) and isinstance(annotation.operator, cst.BitOr):
        return any(
            isinstance(side, cst.Name) and side.value == "None" for side in (annotation.left, annotation.right)
        ) or any(_is_optional(side) for side in (annotation.left, annotation.right))
    if isinstance(annotation, cst.Subscript):
        value = annotation.value
        return (isinstance(value, cst.Name) and value.value == "Optional") or (
            isinstance(value, cst.Attribute) and value.attr.value == "Optional"
        )
    return False


def _is_docstring(statement: cst.BaseStatement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _all_params(params: cst.Parameters) -> list[cst.Param]:
    star = [params.star_arg] if isinstance(params.star_arg, cst.Param) else []
    star_star = [params.star_kwarg] if params.star_kwarg is not None else []
    return [*params.posonly_params, *params.params, *star, *params.kwonly_params, *star_star]


def _names_used(function: cst.FunctionDef) -> frozenset[str]:
    """Every variable name ``function`` spells (not an attribute after a dot, not a keyword of a call)."""
    found: set[str] = set()

    class _Names(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)
            return False

        def visit_Arg(self, node: cst.Arg) -> bool:
            node.value.visit(self)
            return False

        def visit_Name(self, node: cst.Name) -> None:
            found.add(node.value)

    function.params.visit(_Names())
    function.body.visit(_Names())
    return frozenset(found)
