"""Whether the new API accepts code as it stands: the checks a rewrite that changes meaning must pass first.

Renaming an import is not enough for code to keep running. Before a legacy name is swapped for its new one,

- a **call** of it (``CudaGraphRunner(model_runner)``) must bind to the new signature, and where the legacy signature
  is known (:mod:`.legacy_api`), each positional argument must land on a parameter of the same name (the new
  ``get_batch_sizes_to_capture(config)`` binds ``(model_runner)`` but would read it as a config);
- a **subclass** of it must still work on the new base: every ``self.X`` it reads and does not define exists there,
  every method it defines that the new base also defines (after the member renames the migration makes) accepts the
  new base's call, its ``super().__init__(...)`` binds to the new constructor with every argument meaning the same
  (as a call does), it overrides no legacy hook the new base lacks (such an override would never be called) and no
  method whose contract the symbol row's ``hooks`` says changed (its TODO says what the new class does instead), and
  its ``super().method(...)`` calls bind.

Each check returns the problems as short phrases; the caller leaves the code as written and writes them into a
``# TODO(cudagraph-migrate)`` comment. Nothing here rewrites anything.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import libcst as cst

from .exports import ClassApi, ExportsManifest, FunctionApi
from .legacy_api import LegacyApi
from .renames import RenameKind, RenameTable
from .signatures import Param, ParamKind, Signature

__all__ = ["ApiChecker", "CallShape", "signature_of"]


@dataclass(frozen=True)
class CallShape:
    """What a call site passes: positional count, keyword names, and whether it unpacks ``*args``/``**kwargs``."""

    positional: int
    keywords: tuple[str, ...]
    star_args: bool
    star_kwargs: bool

    @classmethod
    def of(cls, call: cst.Call) -> CallShape:
        """The shape of ``call``."""
        positional = sum(1 for arg in call.args if arg.keyword is None and arg.star == "")
        keywords = tuple(arg.keyword.value for arg in call.args if arg.keyword is not None)
        return cls(
            positional,
            keywords,
            any(arg.star == "*" for arg in call.args),
            any(arg.star == "**" for arg in call.args),
        )

    def problem(self, signature: Signature) -> str | None:
        """Why the call would not bind to ``signature`` (None: it binds)."""
        return signature.bind_problem(
            self.positional, self.keywords, star_args=self.star_args, star_kwargs=self.star_kwargs
        )


def signature_of(function: cst.FunctionDef) -> Signature:
    """The signature a ``def`` declares (defaults make a parameter optional)."""
    parameters = function.params
    params: list[Param] = []
    for param in parameters.posonly_params:
        params.append(Param(param.name.value, ParamKind.POSITIONAL_ONLY, param.default is None))
    for param in parameters.params:
        params.append(Param(param.name.value, ParamKind.POSITIONAL_OR_KEYWORD, param.default is None))
    if isinstance(parameters.star_arg, cst.Param):
        params.append(Param(parameters.star_arg.name.value, ParamKind.VAR_POSITIONAL, False))
    for param in parameters.kwonly_params:
        params.append(Param(param.name.value, ParamKind.KEYWORD_ONLY, param.default is None))
    if parameters.star_kwarg is not None:
        params.append(Param(parameters.star_kwarg.name.value, ParamKind.VAR_KEYWORD, False))
    return Signature(tuple(params))


@dataclass
class _ClassBody:
    """What a class body defines and what its methods read through ``self``/``cls`` and ``super()``."""

    defined: set[str] = field(default_factory=set)
    reads: dict[str, cst.CSTNode] = field(default_factory=dict)
    super_calls: list[tuple[str, cst.Call]] = field(default_factory=list)
    super_reads: set[str] = field(default_factory=set)
    methods: list[cst.FunctionDef] = field(default_factory=list)


class _BodyReader(cst.CSTVisitor):
    """Collect :class:`_ClassBody` from one class (nested classes are not followed)."""

    def __init__(self, class_def: cst.ClassDef) -> None:
        super().__init__()
        self.root = class_def
        self.body = _ClassBody()
        self.receivers: list[str | None] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return node is self.root

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        direct = not self.receivers
        if direct:
            self.body.defined.add(node.name.value)
            self.body.methods.append(node)
        first = [*node.params.posonly_params, *node.params.params]
        static = any(_last_name(decorator.decorator) == "staticmethod" for decorator in node.decorators)
        receiver = first[0].name.value if direct and first and not static else None
        self.receivers.append(receiver or (self.receivers[-1] if self.receivers else None))

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.receivers.pop()

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._define(target.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._define(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._define(node.target)

    def _define(self, target: cst.BaseExpression) -> None:
        if isinstance(target, cst.Name) and not self.receivers:
            self.body.defined.add(target.value)
        elif isinstance(target, cst.Attribute) and self._is_receiver(target.value):
            self.body.defined.add(target.attr.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._define(element.value)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if self._is_receiver(node.value):
            self.body.reads.setdefault(node.attr.value, node)
        elif _is_super_call(node.value):
            self.body.super_reads.add(node.attr.value)

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Attribute) and _is_super_call(node.func.value):
            self.body.super_calls.append((node.func.attr.value, node))

    def _is_receiver(self, node: cst.BaseExpression) -> bool:
        return bool(self.receivers) and isinstance(node, cst.Name) and node.value == self.receivers[-1]


class ApiChecker:
    """The checks of one migration run, over the new API (exports manifest) and the legacy one (legacy_api)."""

    def __init__(self, table: RenameTable, exports: ExportsManifest, legacy: LegacyApi) -> None:
        self.table = table
        self.exports = exports
        self.legacy = legacy
        self._member_rows = table.of_kind(RenameKind.ATTRIBUTE, RenameKind.METHOD)

    # --- calls --------------------------------------------------------------------------------------------------

    def call_problems(self, call: cst.Call, new: str, legacy: str) -> list[str]:
        """Why ``call`` of the legacy ``legacy`` cannot become a call of ``new`` (empty: it can)."""
        return self.shape_problems(CallShape.of(call), new, legacy)

    def shape_problems(self, shape: CallShape, new: str, legacy: str) -> list[str]:
        """Why a call shaped ``shape`` of the legacy ``legacy`` cannot become a call of ``new`` (empty: it can)."""
        signature = self._call_signature(new)
        if signature is None:
            return []
        short = new.rpartition(".")[2]
        problem = shape.problem(signature)
        if problem is not None:
            return [f"{short}{signature.spelled()} does not take this call: {problem}"]
        legacy_signature = self.legacy.constructor(legacy)
        if legacy_signature is None:
            return []
        module, _, name = legacy.rpartition(".")
        row = self.table.symbol(module, name)
        same_meaning = dict(row.parameters) if row is not None else {}
        return [
            f"argument {index + 1} is {old_name!r} of the legacy {legacy.rpartition('.')[2]} but {new_name!r} of "
            f"{short}{signature.spelled()}"
            for index, (old_name, new_name) in enumerate(_positional_names(legacy_signature, signature, shape))
            if same_meaning.get(old_name, old_name) != new_name
        ]

    def _call_signature(self, new: str) -> Signature | None:
        api = self.exports.api(new)
        if isinstance(api, FunctionApi):
            return api.signature
        if isinstance(api, ClassApi):
            init = api.method("__init__")
            return init.without_first() if init is not None else None
        return None

    # --- subclasses ---------------------------------------------------------------------------------------------

    def member_renames(self, base: ClassApi) -> dict[str, str]:
        """The member renames the migration makes in a subclass of ``base`` (rows owned by it or an ancestor)."""
        lineage = set(self._lineage(base))
        return {row.old: row.new for row in self._member_rows if lineage & set(row.owners)}

    def _lineage(self, base: ClassApi) -> Iterator[str]:
        yield base.qualified
        for ancestor in base.bases:
            yield ancestor
            api = self.exports.api(ancestor)
            if isinstance(api, ClassApi):
                yield from self._lineage(api)

    def subclass_problems(self, class_def: cst.ClassDef, new: str, legacy: str) -> list[str]:
        """Why ``class_def`` cannot swap its base ``legacy`` for ``new`` (empty: it can)."""
        base = self.exports.api(new)
        if not isinstance(base, ClassApi):
            return []
        reader = _BodyReader(class_def)
        class_def.visit(reader)
        body = reader.body
        renames = self.member_renames(base)
        short = new.rpartition(".")[2]
        problems: list[str] = []
        missing = sorted(
            {
                renames.get(name, name)
                for name in [*body.reads, *body.super_reads]
                if (name not in body.defined or name in body.super_reads) and not _is_dunder(name)
            }
            - {name for name in base.members}
        )
        if missing:
            problems.append(f"{short} has no {', '.join(missing)}")
        problems.extend(self._override_problems(body, base, renames, short, legacy))
        problems.extend(self._construction_problems(body, new, legacy))
        for name, call in body.super_calls:
            if name == "__init__":
                continue  # checked with the construction, meaning included
            method = base.method(renames.get(name, name))
            if method is None:
                continue  # reported above as a member the base lacks
            problem = CallShape.of(call).problem(method.without_first())
            if problem is not None:
                problems.append(f"super().{renames.get(name, name)}(...) does not bind: {problem}")
        return problems

    def _construction_problems(self, body: _ClassBody, new: str, legacy: str) -> list[str]:
        """Why the subclass's own ``super().__init__(...)`` calls could not build ``new``: they would not bind there,
        or would pass a positional argument that means something else (``super().__init__(eagle_worker, ...)``
        lands on the new runner's ``model_runner``). A call handing ``*args``/``**kwargs`` on binds as far as can be
        told here."""
        return [
            f"super().__init__(...): {problem}"
            for name, call in body.super_calls
            if name == "__init__"
            for problem in self.shape_problems(CallShape.of(call), new, legacy)
        ]

    def _override_problems(
        self, body: _ClassBody, base: ClassApi, renames: Mapping[str, str], short: str, legacy: str
    ) -> Iterator[str]:
        legacy_class = self.legacy.classes.get(legacy)
        module, _, legacy_name = legacy.rpartition(".")
        row = self.table.symbol(module, legacy_name)
        instead = dict(row.hooks) if row is not None else {}
        for function in body.methods:
            name = function.name.value
            new_name = renames.get(name, name)
            if _is_dunder(name) or _is_property(function):
                continue  # constructors are called by users (their super().__init__ is checked), not by the base
            base_method = base.method(new_name)
            if base_method is not None and name in instead:
                yield f"{name} overrides {short}.{new_name}, whose contract changed: {instead[name]}"
            elif base_method is not None:
                problem = signature_of(function).override_problem(base_method)
                if problem is not None:
                    yield f"{name} overrides {short}.{new_name}, which it would break: {problem}"
            elif base.has_member(new_name):
                continue
            elif name in instead:
                yield f"{name} overrides a hook of the legacy {legacy_name} that {short} never calls ({instead[name]})"
            elif legacy_class is not None and name in legacy_class.methods:
                yield f"{name} overrides a hook of the legacy {legacy_name} that {short} never calls"


def _positional_names(legacy: Signature, new: Signature, shape: CallShape) -> Iterator[tuple[str, str]]:
    """(legacy parameter, new parameter) for each positional argument both signatures name."""
    legacy_slots = _positional_slots(legacy)
    new_slots = _positional_slots(new)
    for index in range(min(shape.positional, len(legacy_slots), len(new_slots))):
        yield legacy_slots[index], new_slots[index]


def _positional_slots(signature: Signature) -> list[str]:
    return [
        param.name
        for param in signature.params
        if param.kind in (ParamKind.POSITIONAL_ONLY, ParamKind.POSITIONAL_OR_KEYWORD)
    ]


def _is_super_call(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "super"


def _is_property(function: cst.FunctionDef) -> bool:
    return any(
        _last_name(decorator.decorator) in ("property", "setter", "getter", "deleter", "cached_property")
        for decorator in function.decorators
    )


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _last_name(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return None
