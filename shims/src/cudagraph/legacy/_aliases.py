"""Legacy attribute, method and enum-member names on top of the new classes, each warning once and forwarding.

Aliases are installed only when legacy code reaches a class through a shim (or mixes in ``LegacyAliasesMixin``), so
migrated code that never imports ``cudagraph.legacy`` sees no trace of them.
"""

from __future__ import annotations

import enum
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


def install_legacy_aliases(cls: type) -> type:
    """Give ``cls`` every legacy attribute, method and enum-member name of the table whose new name it has.

    Names ``cls`` already defines are left alone. Idempotent; returns ``cls``.
    """
    if vars(cls).get(_INSTALLED_MARK):
        return cls
    table = load_renames()
    if isinstance(cls, enum.EnumMeta):
        for row in table.of_kind(RenameKind.ENUM_MEMBER):
            if row.new in cls.__members__ and row.old not in cls.__members__ and not _defines(cls, row.old):
                type.__setattr__(cls, row.old, _EnumMemberAlias(row))
    else:
        for row in table.of_kind(RenameKind.METHOD):
            if callable(getattr(cls, row.new, None)) and not _defines(cls, row.old):
                setattr(cls, row.old, _MethodAlias(row))
        for row in table.of_kind(RenameKind.ATTRIBUTE):
            if not _defines(cls, row.old):
                setattr(cls, row.old, _AttributeAlias(row))
    type.__setattr__(cls, _INSTALLED_MARK, True)
    return cls


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
