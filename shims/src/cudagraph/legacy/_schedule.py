"""What the shims serve and until when: the removal schedule, derived from the rename table."""

from __future__ import annotations

from dataclasses import dataclass

from cudagraph.config import Rename, RenameKind, load_renames

_PACKAGE = "cudagraph.legacy"

LEGACY_MODULES: tuple[str, ...] = tuple(
    row.old for row in load_renames().of_kind(RenameKind.MODULE) if row.old.startswith(_PACKAGE + ".")
)
"""Every ``cudagraph.legacy.*`` module the table declares (each has a shim module here)."""

_NEW_MODULE_DISTRIBUTIONS = {
    "cudagraph.config": "cudagraph-config",
    "cudagraph.backend_utils": "cudagraph-backend-utils",
    "cudagraph.backend": "cudagraph-backend",
    "cudagraph.runner": "cudagraph-runner",
    "cudagraph.engine": "cudagraph-engine",
}


@dataclass(frozen=True)
class ShimEntry:
    """One legacy name the shims keep alive, the distribution owning its replacement, and when it goes."""

    row: Rename
    owner_distribution: str

    @property
    def removed_in(self) -> str:
        """The owner's version at which this shim must be gone."""
        return self.row.removed_in


def _owner(module: str) -> str:
    top = ".".join(module.split(".")[:2])
    try:
        return _NEW_MODULE_DISTRIBUTIONS[top]
    except KeyError:
        raise ValueError(f"no distribution owns {module!r}; known: {sorted(_NEW_MODULE_DISTRIBUTIONS)}") from None


def shim_entries() -> tuple[ShimEntry, ...]:
    """Every symbol a legacy module serves, with the distribution that owns its new name."""
    table = load_renames()
    return tuple(
        ShimEntry(row, _owner(row.new_module)) for module in LEGACY_MODULES for row in table.symbols_of(module)
    )
