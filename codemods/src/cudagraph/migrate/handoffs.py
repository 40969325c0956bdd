"""Hand-offs: a legacy class or function used as a value, and a legacy class that code patches.

A name that is *called* is checked where it is called (:mod:`.compat`). A name that is *handed on* (returned,
assigned, stored in a container, passed as an argument, a parameter default) is called later by whoever receives it,
and that receiver calls it the way the legacy engine does. That is its **construction contract**: SGLang builds the
graph runner a platform hook returns as ``cls(model_runner)``, and an EAGLE draft runner as ``cls(eagle_worker)``. The
contract is read off the legacy API data (:mod:`.legacy_api`, from SGLang's released sources): the parameters of the
legacy constructor (or function) that a caller must pass, passed positionally. A hand-off moves to the new name only
where that call binds to the new signature with every argument meaning the same (:meth:`ApiChecker.call_problems`'s
rules); a name whose legacy contract is unknown moves only when it is one of the ``cudagraph.legacy`` shims (their
objects are the new ones already) or a function.

A class that code **patches** (``C.x = ...``, ``setattr(C, ...)``, ``delattr``, ``mock.patch.object(C, ...)``,
``getattr``/``hasattr`` probing it) is never swapped for the new class: the engine still builds its own runner, so a
patch moved onto the new class would never reach it. The phrases say what the engine's runner is now and what each
patched member became.

Nothing here rewrites anything: each function returns the problems as short phrases for a ``TODO`` comment.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

import libcst as cst

from .compat import ApiChecker, CallShape
from .exports import ClassApi
from .legacy_api import LegacyApi
from .signatures import Param, ParamKind

__all__ = [
    "ConstructionContract",
    "HandoffChecker",
    "UseKind",
    "classify_use",
    "construction_contract",
    "enclosing_class",
    "member_named",
]

_SHIM_PREFIX = "cudagraph."
"""Legacy names under this prefix are the ``cudagraph.legacy`` shims: the objects they hand out are the new ones."""


class UseKind(str, enum.Enum):
    """How a legacy name is used at one place."""

    CALLED = "called"
    """``Name(...)``: checked as a call."""
    BASE = "base"
    """``class X(Name)``: checked as a subclass."""
    TYPE = "type"
    """A type test, annotation or truth test (``isinstance(x, Name)``, ``x: Name``, ``if Name:``): nothing builds it
    there."""
    MEMBER_READ = "member_read"
    """``Name.member`` read: the member must exist on the new class."""
    PATCHED = "patched"
    """``Name.member = ...``, ``setattr(Name, ...)``, ``getattr``/``hasattr`` probing it, ``patch.object(Name,
    ...)``."""
    VALUE = "value"
    """Handed on: whoever receives it calls it as the legacy engine does (its construction contract)."""
    BORROWED = "borrowed"
    """A method called through the class object on another object: ``Name.method(self, ...)``,
    ``super(Name, self).method(...)``, ``functools.partial(Name.method, ...)``, ``Name.method.__get__(obj)``. The
    method runs on that object, so its class must be one the new method can run on."""


@dataclass(frozen=True)
class ConstructionContract:
    """How the legacy engine calls a legacy class or function it is handed: these parameters, positionally."""

    legacy: str
    positional: tuple[str, ...]

    def spelled(self) -> str:
        """``CudaGraphRunner(model_runner)``."""
        return f"{self.legacy.rpartition('.')[2]}({', '.join(self.positional)})"


def construction_contract(legacy_api: LegacyApi, legacy: str) -> ConstructionContract | None:
    """The contract of ``legacy`` read off its legacy signature (its required parameters), or None if unknown."""
    signature = legacy_api.constructor(legacy)
    if signature is None:
        return None
    positional = tuple(param.name for param in signature.params if _passed_by_the_engine(param))
    return ConstructionContract(legacy, positional)


def _passed_by_the_engine(param: Param) -> bool:
    return param.required and param.kind in (ParamKind.POSITIONAL_ONLY, ParamKind.POSITIONAL_OR_KEYWORD)


_PROBES = frozenset({"setattr", "getattr", "hasattr", "delattr"})
_TYPE_TESTS = frozenset({"isinstance", "issubclass"})


def classify_use(access: cst.CSTNode, parent_of: Mapping[cst.CSTNode, cst.CSTNode]) -> UseKind:
    """How ``access`` (a use of a legacy name: a ``Name``, or ``module.Name``) is used."""
    parent = parent_of.get(access)
    if isinstance(parent, cst.Call) and parent.func is access:
        return UseKind.CALLED
    if isinstance(parent, cst.Attribute) and parent.value is access:
        if _is_store(parent, parent_of):
            return UseKind.PATCHED
        return UseKind.BORROWED if _borrows(parent, parent_of) else UseKind.MEMBER_READ
    if isinstance(parent, cst.Arg) and _is_super_call(parent, parent_of):
        return UseKind.BORROWED
    if _in_annotation(access, parent_of):
        return UseKind.TYPE
    if isinstance(parent, cst.Arg):
        holder = parent_of.get(parent)
        if isinstance(holder, cst.ClassDef):
            return UseKind.BASE if parent in holder.bases else UseKind.VALUE
        if isinstance(holder, cst.Call) and holder.args and holder.args[0] is parent:
            callee = _callee(holder.func)
            if callee in _PROBES or callee == "patch.object" or callee.endswith(".patch.object"):
                return UseKind.PATCHED
        if isinstance(holder, cst.Call) and _callee(holder.func) in _TYPE_TESTS:
            return UseKind.TYPE
    if isinstance(parent, (cst.Element, cst.Tuple)):  # isinstance(x, (A, B))
        tuple_node = parent_of.get(parent) if isinstance(parent, cst.Element) else parent
        arg = parent_of.get(tuple_node) if tuple_node is not None else None
        call = parent_of.get(arg) if isinstance(arg, cst.Arg) else None
        if isinstance(call, cst.Call) and _callee(call.func) in _TYPE_TESTS:
            return UseKind.TYPE
    if isinstance(parent, (cst.Comparison, cst.ComparisonTarget, cst.BooleanOperation, cst.UnaryOperation)):
        return UseKind.TYPE  # type(x) is Name, Name is None, Name and ..., not Name
    if isinstance(parent, (cst.If, cst.IfExp, cst.While)) and parent.test is access:
        return UseKind.TYPE  # a truth test of an optional import
    return UseKind.VALUE


_TYPE_EXPRESSION_PARTS = (
    cst.BinaryOperation,
    cst.Subscript,
    cst.SubscriptElement,
    cst.Index,
    cst.Element,
    cst.Tuple,
    cst.List,
)
"""What a name inside an annotation can sit in: ``A | B``, ``Optional[A]``, ``dict[str, A]``, ``Callable[[A], B]``."""


def _borrows(member: cst.Attribute, parent_of: Mapping[cst.CSTNode, cst.CSTNode]) -> bool:
    """Whether ``Class.member`` runs the method on another object: called with arguments (the object first),
    wrapped in ``partial``, or bound with ``__get__``."""
    holder = parent_of.get(member)
    if isinstance(holder, cst.Call) and holder.func is member:
        return bool(holder.args) and holder.args[0].star == ""
    if isinstance(holder, cst.Attribute) and holder.value is member and holder.attr.value == "__get__":
        return True
    if isinstance(holder, cst.Arg):
        call = parent_of.get(holder)
        return isinstance(call, cst.Call) and _callee(call.func).rpartition(".")[2] in _PARTIALS
    return False


_PARTIALS = frozenset({"partial", "partialmethod", "MethodType"})


def _is_super_call(arg: cst.Arg, parent_of: Mapping[cst.CSTNode, cst.CSTNode]) -> bool:
    """Whether ``arg`` is the class of ``super(Class, obj)``."""
    call = parent_of.get(arg)
    return isinstance(call, cst.Call) and _callee(call.func) == "super" and bool(call.args) and call.args[0] is arg


def enclosing_class(node: cst.CSTNode, parent_of: Mapping[cst.CSTNode, cst.CSTNode]) -> cst.ClassDef | None:
    """The class whose body holds ``node``, if any."""
    current = parent_of.get(node)
    while current is not None and not isinstance(current, cst.ClassDef):
        current = parent_of.get(current)
    return current


def _in_annotation(access: cst.CSTNode, parent_of: Mapping[cst.CSTNode, cst.CSTNode]) -> bool:
    node: cst.CSTNode | None = parent_of.get(access)
    while isinstance(node, _TYPE_EXPRESSION_PARTS):
        node = parent_of.get(node)
    return isinstance(node, (cst.Annotation, cst.TypeAlias))  # x: A, and type X = A | None (PEP 695)


def _is_store(attribute: cst.Attribute, parent_of: Mapping[cst.CSTNode, cst.CSTNode]) -> bool:
    holder = parent_of.get(attribute)
    if isinstance(holder, cst.AssignTarget) and holder.target is attribute:
        return True
    if isinstance(holder, (cst.AugAssign, cst.AnnAssign)) and holder.target is attribute:
        return True
    return isinstance(holder, cst.Del) or (
        isinstance(holder, cst.Element) and isinstance(parent_of.get(holder), cst.Del)
    )


def _callee(func: cst.BaseExpression) -> str:
    parts: list[str] = []
    while isinstance(func, cst.Attribute):
        parts.append(func.attr.value)
        func = func.value
    if isinstance(func, cst.Name):
        parts.append(func.value)
    return ".".join(reversed(parts))


class HandoffChecker:
    """The hand-off checks of one migration run, on top of its call checks."""

    def __init__(self, checker: ApiChecker) -> None:
        self.checker = checker
        self.exports = checker.exports
        self.legacy = checker.legacy

    def value_problems(self, new: str, legacy: str) -> list[str]:
        """Why ``legacy`` handed on as a value cannot become ``new``: the legacy engine's call of it (its construction
        contract) would not bind to ``new`` or would mean something else there."""
        if legacy.startswith(_SHIM_PREFIX):
            return []
        short_old, short_new = legacy.rpartition(".")[2], new.rpartition(".")[2]
        contract = construction_contract(self.legacy, legacy)
        if contract is None:
            if not isinstance(self.exports.api(new), ClassApi):
                return []  # a function handed on is called, not built: the new one keeps its call (module rows)
            return [
                f"{short_old} is handed on here and how its receiver builds it is not known; {short_new} is built "
                f"as {short_new}{self._spelled(new)}"
            ]
        shape = CallShape(len(contract.positional), (), star_args=False, star_kwargs=False)
        problems = self.checker.shape_problems(shape, new, legacy)
        if not problems:
            return []
        missing = self._also_needed(new, contract)
        why = f"{short_new} also needs {', '.join(missing)}" if missing else "; ".join(problems)
        return [
            f"{short_old} is handed on here and its receiver builds it as {contract.spelled()}: {why}; kept on "
            f"{short_old} (or hand on a callable that builds {short_new} with what it needs)"
        ]

    def builders_problem(self, class_name: str, new: str, legacy: str) -> str | None:
        """What to check by hand where a subclass ``class_name`` with no ``__init__`` of its own moves from ``legacy``
        onto ``new`` although the legacy construction contract does not build ``new``: whoever builds the subclass
        (often in another file, out of this run's sight) built it as the legacy engine builds ``legacy``. None where
        the contract is unknown or still builds ``new``."""
        contract = None if legacy.startswith(_SHIM_PREFIX) else construction_contract(self.legacy, legacy)
        if contract is None:
            return None
        shape = CallShape(len(contract.positional), (), star_args=False, star_kwargs=False)
        if not self.checker.shape_problems(shape, new, legacy):
            return None
        short_new = new.rpartition(".")[2]
        arguments = ", ".join(contract.positional)
        return (
            f"{class_name} now derives from {short_new} and has no __init__ of its own: code that builds it as "
            f"{contract.legacy.rpartition('.')[2]} was built, {class_name}({arguments}), must now pass what "
            f"{short_new}{self._spelled(new)} takes; check where {class_name} is built"
        )

    def _also_needed(self, new: str, contract: ConstructionContract) -> list[str]:
        """The required parameters of ``new`` beyond the contract's, where the contract's own ones mean the same."""
        api = self.exports.api(new)
        init = api.method("__init__") if isinstance(api, ClassApi) else None
        if init is None:
            return []
        required = [param.name for param in init.without_first().params if param.required]
        if tuple(required[: len(contract.positional)]) != contract.positional:
            return []
        return required[len(contract.positional) :]

    def member_renames(self, new: str) -> Mapping[str, str]:
        """The member renames the migration makes on ``new`` (a class) and its bases."""
        api = self.exports.api(new)
        return self.checker.member_renames(api) if isinstance(api, ClassApi) else {}

    def _spelled(self, new: str) -> str:
        api = self.exports.api(new)
        init = api.method("__init__") if isinstance(api, ClassApi) else None
        return init.without_first().spelled() if init is not None else "(...)"

    def patch_problem(self, new: str, legacy: str, members: list[str]) -> str:
        """The TODO for a legacy class patched (or probed) at ``members`` (empty: unknown member names)."""
        short_old, short_new = legacy.rpartition(".")[2], new.rpartition(".")[2]
        api = self.exports.api(new)
        renames = self.member_renames(new)
        became = []
        for member in members:
            new_member = renames.get(member, member)
            if isinstance(api, ClassApi) and api.has_member(new_member):
                became.append(f"{member} -> {short_new}.{new_member}")
            else:
                became.append(f"{member} -> no counterpart on {short_new}")
        what = f" ({', '.join(became)})" if became else ""
        return (
            f"{short_old} is patched or probed here{what}; the engine's runner is now {short_new}, so a patch "
            f"of {short_old} moved onto {short_new} would not reach the runner your engine builds: kept on "
            f"{short_old}"
        )

    def member_problem(self, new: str, legacy: str, member: str) -> str | None:
        """Why ``legacy.member`` read off the class cannot become ``new.<member>`` (None: the new class has it)."""
        api = self.exports.api(new)
        if not isinstance(api, ClassApi) or legacy.startswith(_SHIM_PREFIX):
            return None
        new_member = self.member_renames(new).get(member, member)
        if api.has_member(new_member):
            return None
        return f"{legacy.rpartition('.')[2]}.{member} is read here; {new.rpartition('.')[2]} has no {new_member}"


def member_named(access: cst.CSTNode, parent_of: Mapping[cst.CSTNode, cst.CSTNode]) -> str | None:
    """The member a patch, probe or read of ``access`` names (``C.x``, ``setattr(C, "x", ...)``), if spelled out."""
    parent = parent_of.get(access)
    if isinstance(parent, cst.Attribute) and parent.value is access:
        return parent.attr.value
    call = parent_of.get(parent) if isinstance(parent, cst.Arg) else None
    if isinstance(call, cst.Call) and len(call.args) > 1 and isinstance(call.args[1].value, cst.SimpleString):
        value = call.args[1].value.evaluated_value
        return value if isinstance(value, str) and value.isidentifier() else None
    return None
