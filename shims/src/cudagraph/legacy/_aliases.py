"""Legacy attribute, method and enum-member names on top of the new classes, each warning once and forwarding.

Aliases are installed only when legacy code reaches a class through a shim (or mixes in ``LegacyAliasesMixin``), so
migrated code that never imports ``cudagraph.legacy`` sees no trace of them. An alias goes only on a class that owns
the legacy name: one that is, or derives from, a class the row's ``owners`` name. It must never patch any other
class: ``CudaGraphConfig`` never had ``graph_runner``, and an alias there would only warn and then fail. Rows of
cudagraph's own earlier names (``own_name``) get none: their classes keep those names themselves.
"""

from __future__ import annotations

import enum
import sys
from typing import Any

from cudagraph.config import Rename, RenameKind, load_renames

from ._warnings import warn_legacy_use

_INSTALLED_MARK = "__cudagraph_legacy_aliases__"


def _message(row: Rename, what: str) -> str:
    return (
        f"{what} {row.old!r} is deprecated since {row.deprecated_in} and will be removed in {row.removed_in}; "
        f"use {row.new!r} instead. {row.note}"
    )


class _AttributeAlias:
    """A data descriptor: reading or writing the legacy attribute reads or writes the new one."""

    def __init__(self, row: Rename) -> None:
        self.row = row

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        warn_legacy_use(f"attribute:{self.row.old}", _message(self.row, "attribute"))
        return getattr(instance, self.row.new)

    def __set__(self, instance: object, value: Any) -> None:
        warn_legacy_use(f"attribute:{self.row.old}", _message(self.row, "attribute"))
        setattr(instance, self.row.new, value)


class _MethodAlias:
    """A non-data descriptor: the legacy method name returns the bound new method after one warning."""

    def __init__(self, row: Rename) -> None:
        self.row = row

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        warn_legacy_use(f"method:{self.row.old}", _message(self.row, "method"))
        return getattr(instance if instance is not None else owner, self.row.new)


class _EnumMemberAlias:
    """``Enum.OLD`` returns the member ``Enum.NEW`` (the same object) after one warning."""

    def __init__(self, row: Rename) -> None:
        self.row = row

    def __get__(self, instance: object, owner: type) -> Any:
        warn_legacy_use(f"enum_member:{self.row.old}", _message(self.row, "enum member"))
        return getattr(owner, self.row.new)


def _defines(cls: type, name: str) -> bool:
    return any(name in vars(klass) for klass in cls.__mro__)


def _loaded_owner(qualified_name: str) -> type | None:
    # Only owners whose module is already imported: a class deriving from an owner has imported it, and the shims do
    # not depend on every owner's distribution (``cudagraph.engine.ModelRunner``), so importing one here is wrong.
    module_name, _, name = qualified_name.rpartition(".")
    module = sys.modules.get(module_name)
    owner = getattr(module, name, None) if module is not None else None
    return owner if isinstance(owner, type) else None


def owns(cls: type, row: Rename) -> bool:
    """Whether ``cls`` is, or derives from, one of the classes ``row.owners`` names (by their new qualified names)."""
    return any(owner is not None and issubclass(cls, owner) for owner in map(_loaded_owner, row.owners))


def _aliases_for(cls: type) -> dict[str, object]:
    table = load_renames()
    if isinstance(cls, enum.EnumMeta):
        return {
            row.old: _EnumMemberAlias(row)
            for row in table.of_kind(RenameKind.ENUM_MEMBER)
            if owns(cls, row) and row.new in cls.__members__ and row.old not in cls.__members__
        }
    aliases: dict[str, object] = {
        row.old: _MethodAlias(row)
        for row in table.of_kind(RenameKind.METHOD)
        if not row.own_name and owns(cls, row) and callable(getattr(cls, row.new, None))
    }
    aliases.update((row.old, _AttributeAlias(row)) for row in table.of_kind(RenameKind.ATTRIBUTE) if owns(cls, row))
    return aliases


def install_legacy_aliases(cls: type) -> type:
    """Give ``cls`` the legacy attribute, method and enum-member names of the table rows it owns.

    A row applies only when ``cls`` is (a subclass of) one of its ``owners`` and has the new name; names ``cls``
    already defines are left alone. A class that owns no row is not touched at all. Idempotent; returns ``cls``.
    """
    if _INSTALLED_MARK in vars(cls):
        return cls
    aliases = {name: alias for name, alias in _aliases_for(cls).items() if not _defines(cls, name)}
    if not aliases:
        return cls
    for name, alias in aliases.items():
        type.__setattr__(cls, name, alias)
    type.__setattr__(cls, _INSTALLED_MARK, tuple(aliases))
    return cls


def installed_legacy_aliases(cls: type) -> tuple[str, ...]:
    """The legacy names :func:`install_legacy_aliases` put on ``cls`` itself (not on its bases), in install order."""
    return tuple(vars(cls).get(_INSTALLED_MARK, ()))


def remove_legacy_aliases(cls: type) -> tuple[str, ...]:
    """Take the legacy names :func:`install_legacy_aliases` put on ``cls`` off it again; return them."""
    names = installed_legacy_aliases(cls)
    for name in (*names, _INSTALLED_MARK) if names else ():
        type.__delattr__(cls, name)
    return names


class LegacyAliasesMixin:
    """Mix into an engine's own model runner so legacy callers' ``.graph_runner``, ``init_device_graphs()`` and
    friends keep working (each warning once) while the class itself uses the new names.

    Example::

        class ModelRunner(LegacyAliasesMixin):
            def init_decode_cuda_graph(self):
                self.decode_cuda_graph_runner = "runner"

        runner = ModelRunner()
        runner.init_device_graphs()      # DeprecationWarning, forwards to init_decode_cuda_graph()
        assert runner.graph_runner == "runner"
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        install_legacy_aliases(cls)
