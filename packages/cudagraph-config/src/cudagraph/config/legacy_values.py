"""Deprecated spellings of backend values (``"tcpcg"`` -> ``tc_piecewise``): one table, read wherever a backend is.

The spellings are the ``config_string`` rows of ``refactor/renames.toml`` owned by ``cudagraph.config.Backend``,
read at import through :mod:`.renames`; nothing here repeats a row. A spelling resolves exactly like its backend and
raises one ``LegacyFlagWarning`` per ``resolve`` call. Never imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from .renames import Rename, RenameKind, RenameTable, RenameTableError, load_renames
from .vocabulary import Backend

BACKEND_OWNER = "cudagraph.config.Backend"
"""The owner that marks a ``config_string`` row as a spelling of a backend value."""


def legacy_backend_rows(table: RenameTable) -> Mapping[str, Rename]:
    """The ``config_string`` rows of ``table`` that spell a backend, keyed by the legacy spelling.

    Raises ``RenameTableError`` when a row's ``new`` is not a backend.
    """
    rows = {}
    for row in table.of_kind(RenameKind.CONFIG_STRING):
        if BACKEND_OWNER not in row.owners:
            continue
        if row.new not in {backend.value for backend in Backend}:
            allowed = ", ".join(backend.value for backend in Backend)
            raise RenameTableError(
                f"{table.source}: config_string {row.old!r} is owned by {BACKEND_OWNER} but new = {row.new!r} is no "
                f"backend; allowed: {allowed}"
            )
        rows[row.old] = row
    return MappingProxyType(rows)


_LEGACY_BACKEND_ROWS = legacy_backend_rows(load_renames())

LEGACY_BACKEND_VALUES: Mapping[str, Backend] = MappingProxyType(
    {spelling: Backend(row.new) for spelling, row in _LEGACY_BACKEND_ROWS.items()}
)
"""Deprecated backend value spelling -> the backend it means; accepted in ``--cuda-graph-mode`` JSON, the per-phase
backend flags and their keywords until the row's ``removed_in``."""


def legacy_value_message(spelling: str, labels: Sequence[str]) -> str:
    """The one warning a legacy ``spelling`` raises per ``resolve`` call, naming the flags that used it."""
    row = _LEGACY_BACKEND_ROWS[spelling]
    return (
        f"backend value {spelling!r} (in {', '.join(labels)}) is deprecated since cudagraph-config {row.deprecated_in} "
        f"and will be removed in {row.removed_in}; use {LEGACY_BACKEND_VALUES[spelling].value!r} instead"
    )
