"""Signatures as data: whether a call binds, whether an override accepts its base's calls, and how to spell one.

Pure Python (no libcst, no torch), so the exports manifest, the legacy API data and the codemods' checks share one
model. Binding follows Python's own rules (what ``inspect.Signature.bind`` accepts), reduced to what a call site
shows statically: how many positional arguments, which keywords, and whether it unpacks ``*args``/``**kwargs``.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Collection, Sequence
from dataclasses import dataclass

__all__ = ["Param", "ParamKind", "Signature"]


class ParamKind(str, enum.Enum):
    """How a parameter can be passed (``inspect.Parameter``'s kinds)."""

    POSITIONAL_ONLY = "positional_only"
    POSITIONAL_OR_KEYWORD = "positional_or_keyword"
    VAR_POSITIONAL = "var_positional"
    KEYWORD_ONLY = "keyword_only"
    VAR_KEYWORD = "var_keyword"


_FROM_INSPECT = {
    inspect.Parameter.POSITIONAL_ONLY: ParamKind.POSITIONAL_ONLY,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: ParamKind.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.VAR_POSITIONAL: ParamKind.VAR_POSITIONAL,
    inspect.Parameter.KEYWORD_ONLY: ParamKind.KEYWORD_ONLY,
    inspect.Parameter.VAR_KEYWORD: ParamKind.VAR_KEYWORD,
}
_POSITIONAL = (ParamKind.POSITIONAL_ONLY, ParamKind.POSITIONAL_OR_KEYWORD)
_BY_KEYWORD = (ParamKind.POSITIONAL_OR_KEYWORD, ParamKind.KEYWORD_ONLY)


@dataclass(frozen=True)
class Param:
    """One parameter: its name, its kind, and whether a call must pass it (no default; never ``*``/``**``)."""

    name: str
    kind: ParamKind
    required: bool


@dataclass(frozen=True)
class Signature:
    """The parameters of a function or method as declared (a method's include ``self``/``cls``)."""

    params: tuple[Param, ...]

    @classmethod
    def from_inspect(cls, signature: inspect.Signature) -> Signature:
        """The model of a live signature."""
        return cls(
            tuple(
                Param(
                    param.name,
                    _FROM_INSPECT[param.kind],
                    param.default is inspect.Parameter.empty
                    and param.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD),
                )
                for param in signature.parameters.values()
            )
        )

    def to_json(self) -> list[list[object]]:
        """``[[name, kind, required], ...]``."""
        return [[param.name, param.kind.value, param.required] for param in self.params]

    @classmethod
    def from_json(cls, raw: Sequence[Sequence[object]]) -> Signature:
        """The inverse of :meth:`to_json`."""
        return cls(tuple(Param(str(name), ParamKind(str(kind)), bool(required)) for name, kind, required in raw))

    def without_first(self) -> Signature:
        """The signature with the bound ``self``/``cls`` dropped (unchanged when it takes no positional one)."""
        if self.params and self.params[0].kind in _POSITIONAL:
            return Signature(self.params[1:])
        return self

    @property
    def positional(self) -> tuple[Param, ...]:
        """Parameters a positional argument can fill, in order."""
        return tuple(param for param in self.params if param.kind in _POSITIONAL)

    @property
    def by_keyword(self) -> frozenset[str]:
        """Names a keyword argument can fill (positional-only names cannot: ``**kwargs`` collects those)."""
        return frozenset(param.name for param in self.params if param.kind in _BY_KEYWORD)

    @property
    def takes_var_positional(self) -> bool:
        """Whether the signature collects extra positional arguments (``*args``)."""
        return self._has(ParamKind.VAR_POSITIONAL)

    @property
    def takes_var_keyword(self) -> bool:
        """Whether the signature collects extra keyword arguments (``**kwargs``)."""
        return self._has(ParamKind.VAR_KEYWORD)

    def _has(self, kind: ParamKind) -> bool:
        return any(param.kind is kind for param in self.params)

    def bind_problem(
        self, positional: int, keywords: Collection[str], *, star_args: bool = False, star_kwargs: bool = False
    ) -> str | None:
        """None when a call with ``positional`` positional arguments and ``keywords`` binds; else the one reason.

        The rules are Python's own (what calling a function with this signature accepts). A call that unpacks
        ``*args``/``**kwargs`` cannot be proven to bind unless the signature takes them itself; when it does, the
        unpacked values are assumed to fill whatever the visible arguments leave.
        """
        if star_args and not self.takes_var_positional:
            return "the call passes *args, whose length cannot be checked here"
        if star_kwargs and not self.takes_var_keyword:
            return "the call passes **kwargs, whose keys cannot be checked here"
        problem = self._positional_problem(positional)
        if problem is not None:
            return problem
        filled = {param.name for param in self.positional[:positional]}
        seen: set[str] = set()
        for keyword in keywords:
            problem = self._keyword_problem(keyword, positional, seen)
            if problem is not None:
                return problem
            seen.add(keyword)
        if star_args or star_kwargs:
            return None
        filled |= seen & self.by_keyword
        missing = [param.name for param in self.params if param.required and param.name not in filled]
        if missing:
            names = ", ".join(repr(name) for name in missing)
            return f"missing required argument{_plural(len(missing))} {names}"
        return None

    def _positional_problem(self, positional: int) -> str | None:
        slots = len(self.positional)
        if positional > slots and not self.takes_var_positional:
            return f"takes at most {slots} positional argument{_plural(slots)}, {positional} given"
        return None

    def _keyword_problem(self, keyword: str, positional: int, seen: Collection[str] = ()) -> str | None:
        """Why ``keyword=...`` is refused beside ``positional`` positional arguments (None: it is taken)."""
        if keyword in seen:
            return f"keyword argument {keyword!r} repeated"
        if keyword in self.by_keyword:
            if keyword in (param.name for param in self.positional[:positional]):
                return f"argument {keyword!r} given twice"
            return None
        if self.takes_var_keyword:
            return None  # **kwargs collects it (a positional-only parameter's name included)
        if any(param.name == keyword and param.kind is ParamKind.POSITIONAL_ONLY for param in self.params):
            return f"positional-only argument {keyword!r} passed by keyword"
        return f"unexpected keyword argument {keyword!r}"

    def override_problem(self, base: Signature, *, required_by_name: bool = False) -> str | None:
        """None when every call ``base`` accepts also binds to this signature (an override of it); else why not.

        Both signatures include ``self``. A call is a number of positional arguments and a set of keyword names;
        for each positional count the base accepts, every keyword it accepts beside them must be taken here too,
        and the smallest such call (the base's required arguments, by position as far as they go, the rest by
        name) must fill everything required here. That is exactly "every call binding to the base binds here":
        keywords are refused one at a time, and adding arguments never makes a required one missing.

        The calls counted pass the base's required positional parameters by position, as a base calling its own
        hook does (``self.capture_bucket(bucket)``), so an override may rename them. ``required_by_name=True``
        counts every call Python allows, those naming such a parameter (``bucket=...``) included.
        """
        mine, theirs = self.without_first(), base.without_first()
        if theirs.takes_var_positional and not mine.takes_var_positional:
            return f"the base{theirs.spelled()} takes *args; the override{mine.spelled()} does not"
        if theirs.takes_var_keyword and not mine.takes_var_keyword:
            return f"the base{theirs.spelled()} takes **kwargs; the override{mine.spelled()} does not"
        most = len(theirs.positional)
        if mine._positional_problem(most) is not None:
            return (
                f"the base{theirs.spelled()} is called with up to {most} positional argument{_plural(most)}; "
                f"the override{mine.spelled()} takes {len(mine.positional)}"
            )
        # Required positionals come first; those a call cannot (or, by convention, does not) name set the fewest.
        by_position = (ParamKind.POSITIONAL_ONLY,) if required_by_name else _POSITIONAL
        fewest = sum(1 for param in theirs.params if param.kind in by_position and param.required)
        # Beyond both signatures' slots, more positional arguments only feed *args: nothing new to learn there.
        widest = max(most, len(mine.positional)) + 1 if theirs.takes_var_positional else most
        # The fullest positional call first: the base's own calls of a hook pass its arguments that way, so a
        # problem there is the one worth naming.
        for positional in range(widest, fewest - 1, -1):
            problem = mine._problem_beside(theirs, positional)
            if problem is not None:
                return problem
        return None

    def _problem_beside(self, base: Signature, positional: int) -> str | None:
        """Why some call of ``base`` with ``positional`` positional arguments does not bind here (self dropped)."""
        passed = {param.name for param in base.positional[:positional]}
        names = base.by_keyword - passed
        if base.takes_var_keyword:
            # Any other name lands in the base's **kwargs; names this signature knows are the ones it may refuse.
            names |= {param.name for param in self.params} - (base.by_keyword & passed)
        for keyword in sorted(names):
            if self._keyword_problem(keyword, positional) is not None:
                called = f"{_count(positional, 'positional argument')} and {keyword}=..."
                if keyword in self.by_keyword:
                    return (
                        f"the base{base.spelled()} may be called with {called}; "
                        f"the override{self.spelled()} would get {keyword} twice"
                    )
                return (
                    f"the base{base.spelled()} may be called with {keyword}=...; "
                    f"the override{self.spelled()} has no {keyword}"
                )
        needed = {param.name for param in base.params if param.required and param.kind in _BY_KEYWORD} - passed
        filled = {param.name for param in self.positional[:positional]} | (needed & self.by_keyword)
        missing = [param.name for param in self.params if param.required and param.name not in filled]
        if missing:
            return (
                f"the override{self.spelled()} requires {', '.join(missing)}, which callers of the base"
                f"{base.spelled()} need not pass"
            )
        return None

    def spelled(self) -> str:
        """``(model_runner, config, *, backend=..., show_progress=...)``."""
        parts: list[str] = []
        star_written = False
        for index, param in enumerate(self.params):
            if param.kind is ParamKind.KEYWORD_ONLY and not star_written:
                parts.append("*")
                star_written = True
            if param.kind is ParamKind.VAR_POSITIONAL:
                parts.append(f"*{param.name}")
                star_written = True
            elif param.kind is ParamKind.VAR_KEYWORD:
                parts.append(f"**{param.name}")
            else:
                parts.append(param.name if param.required else f"{param.name}=...")
            following = self.params[index + 1] if index + 1 < len(self.params) else None
            if param.kind is ParamKind.POSITIONAL_ONLY and (
                following is None or following.kind is not ParamKind.POSITIONAL_ONLY
            ):
                parts.append("/")
        return f"({', '.join(parts)})"


def _plural(count: int) -> str:
    return "" if count == 1 else "s"


def _count(count: int, noun: str) -> str:
    return f"{count} {noun}{_plural(count)}"
