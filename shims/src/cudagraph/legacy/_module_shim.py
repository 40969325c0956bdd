"""PEP 562 ``__getattr__`` / ``__dir__`` for a legacy module, built from the rename table's symbol rows.

The object a legacy name resolves to *is* the new object (identity, never a wrapper), imported lazily so that a
legacy module costs nothing until a name is used.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable

from cudagraph.config import Rename, load_renames

from ._aliases import install_legacy_aliases
from ._warnings import warn_legacy_use


def _resolve(row: Rename) -> object:
    target = getattr(importlib.import_module(row.new_module), row.new_name)
    if isinstance(target, type):
        install_legacy_aliases(target)
    return target


def deprecation_message(row: Rename) -> str:
    """What a use of ``row.old`` says: what to import instead and when the old name goes away."""
    spelled = f"from {row.new_module} import {row.new_name}"
    return (
        f"{row.old} is deprecated since {row.deprecated_in} and will be removed in {row.removed_in}; "
        f"use `{spelled}` instead (or run `cudagraph-migrate` on your code). {row.note}"
    )


def module_shim(module_name: str) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the legacy module ``module_name``, serving its symbol rows."""
    rows = {row.old_name: row for row in load_renames().symbols_of(module_name)}
    if not rows:
        raise RuntimeError(f"renames.toml has no symbol rows for legacy module {module_name}")

    def __getattr__(name: str) -> object:
        row = rows.get(name)
        if row is None:
            hint = difflib.get_close_matches(name, rows, n=1)
            did_you_mean = f"; did you mean {hint[0]!r}?" if hint else ""
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}{did_you_mean}")
        warn_legacy_use(row.old, deprecation_message(row))
        return _resolve(row)

    def __dir__() -> list[str]:
        return sorted(rows)

    return __getattr__, __dir__
