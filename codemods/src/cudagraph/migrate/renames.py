"""The rename table's typed reader, kept importable here for the codemods and their callers.

The reader and the table it reads belong to :mod:`cudagraph.config.renames` (the ``cudagraph-config`` wheel ships
``renames.toml``); this module only re-exports it, so ``cudagraph.migrate.renames`` and ``cudagraph.config.renames``
are one table, one set of types and one cache.
"""

from __future__ import annotations

from cudagraph.config.renames import (
    PACKAGED_RENAMES_PATH,
    SCHEMA_VERSION,
    Rename,
    RenameKind,
    RenameTable,
    RenameTableError,
    load_renames,
    renames_path,
)

__all__ = [
    "PACKAGED_RENAMES_PATH",
    "SCHEMA_VERSION",
    "Rename",
    "RenameKind",
    "RenameTable",
    "RenameTableError",
    "load_renames",
    "renames_path",
]
