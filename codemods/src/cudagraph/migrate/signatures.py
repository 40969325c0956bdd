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

    def _has(self, kind: ParamKind) -> bool:
        return any(param.kind is kind for param in self.params)

    def bind_problem(
        self, positional: int, keywords: Collection[str], *, star_args: bool = False, star_kwargs: bool = False
    ) -> str | None:
        """None when a call with ``positional`` positional arguments and ``keywords`` binds; else the one reason.

        A call that unpacks ``*args``/``**kwargs`` cannot be proven to bind unless the signature takes them itself.
        """
        if star_args and not self._has(ParamKind.VAR_POSITIONAL):
            return "the call passes *args, whose length cannot be checked here"
        if star_kwargs and not self._has(ParamKind.VAR_KEYWORD):
            return "the call passes **kwargs, whose keys cannot be checked here"
        slots = self.positional
        if positional > len(slots) and not self._has(ParamKind.VAR_POSITIONAL):
            return f"takes at most {len(slots)} positional argument{_plural(len(slots))}, {positional} given"
        filled = {param.name for param in slots[:positional]}
        by_name = {param.name: param for param in self.params if param.kind in _BY_KEYWORD}
        for keyword in keywords:
            if keyword in filled:
                return f"argument {keyword!r} given twice"
            if keyword not in by_name and not self._has(ParamKind.VAR_KEYWORD):
                return f"unexpected keyword argument {keyword!r}"
            filled.add(keyword)
        if star_args or star_kwargs:
            return None  # the unpacked values may fill whatever is left
        missing = [param.name for param in self.params if param.required and param.name not in filled]
        if missing:
            names = ", ".join(repr(name) for name in missing)
            return f"missing required argument{_plural(len(missing))} {names}"
        return None

    def override_problem(self, base: Signature) -> str | None:
        """None when every call ``base`` accepts also binds to this signature (an override of it); else why not.

        Both signatures include ``self``. The base's positional parameters must each have a positional slot here;
        its keyword-only and optional parameters (callers pass those by name) must be taken here by the same name;
        and nothing here may be required that the base's callers need not pass.
        """
        mine, theirs = self.without_first(), base.without_first()
        base_positional = theirs.positional
        if theirs._has(ParamKind.VAR_POSITIONAL) and not mine._has(ParamKind.VAR_POSITIONAL):
            return f"the base{theirs.spelled()} takes *args; the override{mine.spelled()} does not"
        if theirs._has(ParamKind.VAR_KEYWORD) and not mine._has(ParamKind.VAR_KEYWORD):
            return f"the base{theirs.spelled()} takes **kwargs; the override{mine.spelled()} does not"
        if len(base_positional) > len(mine.positional) and not mine._has(ParamKind.VAR_POSITIONAL):
            return (
                f"the base{theirs.spelled()} is called with up to {len(base_positional)} positional "
                f"argument{_plural(len(base_positional))}; the override{mine.spelled()} takes {len(mine.positional)}"
            )
        # Required positional parameters are passed by position; optional and keyword-only ones usually by name.
        by_name = [
            param.name
            for param in theirs.params
            if param.kind is ParamKind.KEYWORD_ONLY
            or (param.kind is ParamKind.POSITIONAL_OR_KEYWORD and not param.required)
        ]
        mine_by_name = {param.name for param in mine.params if param.kind in _BY_KEYWORD}
        for name in by_name:
            if name not in mine_by_name and not mine._has(ParamKind.VAR_KEYWORD):
                return (
                    f"the base{theirs.spelled()} may be called with {name}=...; "
                    f"the override{mine.spelled()} has no {name}"
                )
        required_by_base = sum(1 for param in base_positional if param.required)
        for index, param in enumerate(mine.params):
            if not param.required:
                continue
            fills = param.kind in _POSITIONAL and index < required_by_base
            if not fills:
                return (
                    f"the override{mine.spelled()} requires {param.name}, which callers of the base"
                    f"{theirs.spelled()} need not pass"
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
