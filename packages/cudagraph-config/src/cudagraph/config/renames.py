"""The typed view of ``refactor/renames.toml``, the one table of legacy names and their replacements.

This module is the table's one reader. ``cudagraph.config`` derives its legacy flags and backend value spellings from
it, ``cudagraph.migrate`` (codemods) re-exports it and ``cudagraph.legacy`` (shims) serves the legacy names from it.
It must never import libcst, torch or another ``cudagraph`` module: only the standard library (and ``tomli`` on
Python 3.10), so every distribution can read the table without pulling in anything else.
"""

from __future__ import annotations

import enum
import functools
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

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

SCHEMA_VERSION = 1
"""The ``schema`` value this loader understands."""

PACKAGED_RENAMES_PATH = Path(__file__).parent / "data" / "renames.toml"
"""Where the wheel ships its copy of the table (hatch ``force-include``)."""

# packages/cudagraph-config/src/cudagraph/config/renames.py -> the checkout root (editable installs read it there).
_CHECKOUT_RENAMES_PATH = Path(__file__).resolve().parents[5] / "refactor" / "renames.toml"


class RenameTableError(ValueError):
    """``renames.toml`` is missing or malformed; the message names the row and field."""


class RenameKind(str, enum.Enum):
    """What a row renames, which decides how ``old`` and ``new`` are spelled."""

    MODULE = "module"
    """Dotted module path to dotted module path."""
    SYMBOL = "symbol"
    """``legacy.module.Name`` to ``new.module.NewName``; one row per legacy module that defines the name."""
    ATTRIBUTE = "attribute"
    """Instance attribute name (``.graph_runner``)."""
    METHOD = "method"
    """Method name (``init_device_graphs``)."""
    ENUM_MEMBER = "enum_member"
    """Enum member name (``Backend.TCPIECEWISE``)."""
    CONFIG_STRING = "config_string"
    """A string value users write in configs and arguments (``"tcpcg"``)."""
    KWARG = "kwarg"
    """A server-argument keyword name of Python callers."""
    CLI_FLAG = "cli_flag"
    """A command-line flag string in an argument list."""


_DOTTED_KINDS = frozenset({RenameKind.MODULE, RenameKind.SYMBOL})
_REQUIRED_FIELDS = ("kind", "old", "new", "deprecated_in", "removed_in", "note")
_OPTIONAL_FIELDS = (
    "also",
    "value",
    "owners",
    "legacy_owners",
    "parameters",
    "shared_state",
    "still_shipped",
    "own_name",
    "hooks",
)
_SCOPED_KINDS = frozenset(
    {RenameKind.ATTRIBUTE, RenameKind.METHOD, RenameKind.ENUM_MEMBER, RenameKind.CONFIG_STRING, RenameKind.KWARG}
)
"""Kinds whose names are common words: each row names the owners its rename is tied to."""


@dataclass(frozen=True)
class Rename:
    """One row: a legacy name, what replaces it, and when it was deprecated and goes away."""

    kind: RenameKind
    old: str
    new: str
    deprecated_in: str
    removed_in: str
    note: str
    also: tuple[str, ...] = ()
    """Further targets where one legacy switch became several (``disable_cuda_graph`` -> both per-phase switches)."""
    value: str | None = None
    """The value the new option takes where a legacy boolean switch became a valued option."""
    owners: tuple[str, ...] = ()
    """Qualified names (new spellings) of the classes or functions this name belongs to; the rename applies only
    where a call, receiver, subclass or argument is tied to one of them."""
    legacy_owners: tuple[str, ...] = ()
    """Qualified names (legacy spellings) of the legacy engine's classes and functions that owned this name (SGLang's
    ``ModelRunner``, ``ServerArgs``, ...): code tied to one of them is recognised as legacy too, and is migrated where
    the owner maps onto a new one, or reported with the new spelling where the owner is not ours."""
    shared_state: bool = False
    """(symbol rows) The name reads or sets state the legacy graph runner shares with its engine (the capture flag,
    the graph pool, the forward context): moved off a legacy engine's module, it would read or set cudagraph's copy
    while the engine's runner still uses its own, so it moves only together with that runner."""
    parameters: tuple[tuple[str, str], ...] = ()
    """(symbol and method rows) ``(legacy parameter, new parameter)`` pairs where a function or method kept a
    parameter's meaning under another name (``set_global_graph_memory_pool(val)`` is ``(pool)``,
    ``capture_one_shape(shape)`` is ``capture_bucket(bucket)``): a positional argument still means the same, a
    keyword argument of a renamed call and an override's parameter take the new name."""
    own_name: bool = False
    """(method rows) The old name is cudagraph's own earlier spelling (``capture_one_shape``), not a legacy
    engine's: the owning class keeps it as a warning alias itself, so the shims serve nothing for the row, and no
    legacy engine owned it (the row has no ``legacy_owners``)."""
    hooks: tuple[tuple[str, str], ...] = ()
    """(symbol rows of classes) ``(legacy hook, what the new class does instead)`` pairs for the legacy class's
    methods that have no counterpart on the new one (SGLang's EAGLE runners' ``_postprocess_output_to_raw_bs``): an
    override of one keeps the subclass on the legacy base, and its TODO says what replaced the hook."""
    still_shipped: bool = False
    """(module rows) The legacy engine's newest release still ships this module under the same path, rebased on its
    new runners (SGLang's EAGLE draft runners): its names are legacy only in a file that also uses a retired legacy
    module, and SGLang's current code that imports them is left alone."""

    @property
    def targets(self) -> tuple[str, ...]:
        """Every name the old one becomes, ``new`` first."""
        return (self.new, *self.also)

    @property
    def old_module(self) -> str:
        """The legacy module of a symbol row (a module row: ``old`` itself)."""
        return self._split(self.old)[0]

    @property
    def old_name(self) -> str:
        """The legacy name of a symbol row inside its module."""
        return self._split(self.old)[1]

    @property
    def new_module(self) -> str:
        """The module a symbol row's name moves to (a module row: ``new`` itself)."""
        return self._split(self.new)[0]

    @property
    def new_name(self) -> str:
        """The name a symbol row's name becomes inside ``new_module``."""
        return self._split(self.new)[1]

    def _split(self, dotted: str) -> tuple[str, str]:
        if self.kind is RenameKind.MODULE:
            return dotted, ""
        if self.kind is not RenameKind.SYMBOL:
            raise AttributeError(f"{self.kind.value} rows have no module part; only module and symbol rows do")
        module, _, name = dotted.rpartition(".")
        return module, name


@dataclass(frozen=True)
class RenameTable:
    """Every row of ``renames.toml``, in file order, with the lookups the codemods and shims need."""

    rows: tuple[Rename, ...]
    source: Path | None = None

    def __iter__(self) -> Iterator[Rename]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def of_kind(self, *kinds: RenameKind) -> tuple[Rename, ...]:
        """The rows of the given kinds, in file order."""
        return tuple(row for row in self.rows if row.kind in kinds)

    @functools.cached_property
    def modules(self) -> Mapping[str, Rename]:
        """Module rows keyed by legacy module path."""
        return MappingProxyType({row.old: row for row in self.of_kind(RenameKind.MODULE)})

    @functools.cached_property
    def _symbols(self) -> Mapping[tuple[str, str], Rename]:
        return MappingProxyType({(row.old_module, row.old_name): row for row in self.of_kind(RenameKind.SYMBOL)})

    def symbol(self, old_module: str, old_name: str) -> Rename | None:
        """The symbol row for ``old_name`` imported from ``old_module``, or ``None`` when the table has none."""
        return self._symbols.get((old_module, old_name))

    def symbols_of(self, old_module: str) -> tuple[Rename, ...]:
        """Every symbol row whose legacy module is ``old_module`` (what a shim of that module exposes)."""
        return tuple(row for row in self.of_kind(RenameKind.SYMBOL) if row.old_module == old_module)

    def by_old(self, kind: RenameKind) -> Mapping[str, Rename]:
        """The rows of one kind keyed by ``old``."""
        return MappingProxyType({row.old: row for row in self.of_kind(kind)})


def renames_path() -> Path:
    """The table this installation reads: the wheel's packaged copy, else the source checkout's ``refactor/``."""
    for candidate in (PACKAGED_RENAMES_PATH, _CHECKOUT_RENAMES_PATH):
        if candidate.is_file():
            return candidate
    raise RenameTableError(
        f"renames.toml not found: looked for {PACKAGED_RENAMES_PATH} (installed wheel) and "
        f"{_CHECKOUT_RENAMES_PATH} (source checkout)"
    )


def load_renames(path: Path | str | None = None) -> RenameTable:
    """Load and validate the rename table (default: :func:`renames_path`); cached per path."""
    return _load(Path(path) if path is not None else renames_path())


@functools.lru_cache(maxsize=8)
def _load(path: Path) -> RenameTable:
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise RenameTableError(f"cannot read rename table {path}: {error}") from error
    if document.get("schema") != SCHEMA_VERSION:
        raise RenameTableError(
            f"{path}: schema = {document.get('schema')!r}; this loader reads schema {SCHEMA_VERSION}"
        )
    raw_rows = document.get("rename", [])
    rows = tuple(_parse_row(path, index, raw) for index, raw in enumerate(raw_rows, start=1))
    table = RenameTable(rows=rows, source=path)
    _check_consistency(path, table)
    return table


def _parse_row(path: Path, index: int, raw: Mapping[str, object]) -> Rename:
    where = f"{path}: rename row {index} (old = {raw.get('old')!r})"
    unknown = set(raw) - set(_REQUIRED_FIELDS) - set(_OPTIONAL_FIELDS)
    if unknown:
        allowed = ", ".join(_REQUIRED_FIELDS + _OPTIONAL_FIELDS)
        raise RenameTableError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: {allowed}")
    missing = [name for name in _REQUIRED_FIELDS if not isinstance(raw.get(name), str) or not raw.get(name)]
    if missing:
        raise RenameTableError(f"{where}: missing or non-string field(s) {missing}")
    try:
        kind = RenameKind(raw["kind"])
    except ValueError:
        allowed = ", ".join(kind.value for kind in RenameKind)
        raise RenameTableError(f"{where}: kind = {raw['kind']!r}; allowed: {allowed}") from None
    also = raw.get("also", [])
    if not isinstance(also, list) or not all(isinstance(item, str) for item in also):
        raise RenameTableError(f"{where}: 'also' must be a list of strings")
    value = raw.get("value")
    if value is not None and not isinstance(value, str):
        raise RenameTableError(f"{where}: 'value' must be a string")
    owners = raw.get("owners", [])
    if not isinstance(owners, list) or not all(isinstance(item, str) and _is_dotted(item) for item in owners):
        raise RenameTableError(f"{where}: 'owners' must be a list of dotted qualified names")
    legacy_owners = raw.get("legacy_owners", [])
    if not isinstance(legacy_owners, list) or not all(
        isinstance(item, str) and _is_dotted(item) for item in legacy_owners
    ):
        raise RenameTableError(f"{where}: 'legacy_owners' must be a list of dotted qualified names")
    shared_state = raw.get("shared_state", False)
    if not isinstance(shared_state, bool):
        raise RenameTableError(f"{where}: 'shared_state' must be true or false")
    still_shipped = raw.get("still_shipped", False)
    if not isinstance(still_shipped, bool) or (still_shipped and kind is not RenameKind.MODULE):
        raise RenameTableError(f"{where}: 'still_shipped' must be true or false, and only on module rows")
    own_name = raw.get("own_name", False)
    if not isinstance(own_name, bool) or (own_name and (kind is not RenameKind.METHOD or legacy_owners)):
        raise RenameTableError(
            f"{where}: 'own_name' must be true or false, and only on method rows without 'legacy_owners' (an own "
            "name belongs to cudagraph's classes alone)"
        )
    parameters = raw.get("parameters", {})
    if not isinstance(parameters, dict) or not all(
        isinstance(old, str) and isinstance(new, str) for old, new in parameters.items()
    ):
        raise RenameTableError(f"{where}: 'parameters' must be a table of legacy name = new name strings")
    hooks = raw.get("hooks", {})
    if (
        not isinstance(hooks, dict)
        or not all(isinstance(old, str) and old.isidentifier() and isinstance(new, str) for old, new in hooks.items())
        or (hooks and kind is not RenameKind.SYMBOL)
    ):
        raise RenameTableError(
            f"{where}: 'hooks' must be a table of legacy method name = what the new class does instead, and only on "
            "symbol rows"
        )
    if kind in _SCOPED_KINDS and not owners:
        raise RenameTableError(
            f"{where}: {kind.value} rows need 'owners' (the legacy API the name belongs to), so the rename never "
            "touches another program's name of the same spelling"
        )
    row = Rename(
        kind=kind,
        old=str(raw["old"]),
        new=str(raw["new"]),
        deprecated_in=str(raw["deprecated_in"]),
        removed_in=str(raw["removed_in"]),
        note=str(raw["note"]),
        also=tuple(also),
        value=value,
        owners=tuple(owners),
        legacy_owners=tuple(legacy_owners),
        parameters=tuple(sorted(parameters.items())),
        shared_state=shared_state,
        still_shipped=still_shipped,
        own_name=own_name,
        hooks=tuple(sorted(hooks.items())),
    )
    if kind in _DOTTED_KINDS and not all(_is_dotted(name) for name in (row.old, row.new)):
        raise RenameTableError(f"{where}: {kind.value} rows need dotted Python paths, got {row.old!r} -> {row.new!r}")
    if kind is RenameKind.SYMBOL and "." not in row.new:
        raise RenameTableError(f"{where}: symbol rows need 'new' as 'module.Name', got {row.new!r}")
    return row


def _check_consistency(path: Path, table: RenameTable) -> None:
    seen: set[tuple[RenameKind, str]] = set()
    for row in table:
        key = (row.kind, row.old)
        if key in seen:
            raise RenameTableError(f"{path}: {row.kind.value} {row.old!r} appears twice; a rename lives in one row")
        seen.add(key)
        if row.kind is RenameKind.SYMBOL and row.old_module not in table.modules:
            raise RenameTableError(
                f"{path}: symbol {row.old!r} lives in {row.old_module!r}, which has no module row; add one"
            )


def _is_dotted(name: str) -> bool:
    return all(part.isidentifier() for part in name.split("."))
