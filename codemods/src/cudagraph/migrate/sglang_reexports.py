"""Where SGLang's released packages re-export the classes whose options are SGLang's own (``ServerArgs``, ``Engine``).

Code reaches SGLang's ``ServerArgs`` through many modules besides ``sglang.srt.server_args``: every SGLang module that
imports it re-exports it (``from sglang.srt.entrypoints.http_server import ServerArgs`` works), and the package's top
level binds ``sglang.ServerArgs`` and ``sglang.Engine`` lazily. So that a call such as ``ServerArgs(disable_cuda_graph=
True)`` is recognised as SGLang's whichever of these spellings imported it, this table maps each re-exported name to
the legacy owner it is (the ``legacy_owners`` of the ``kwarg`` rows of ``refactor/renames.toml``).

The data (``sglang_reexports.json``, shipped in the wheel) is read statically with :mod:`ast` from SGLang's released
sources, never imported: every module-level name bound at run time by an import (also inside top-level ``if`` and
``try`` blocks, never under ``if TYPE_CHECKING:``) or by ``Name = LazyImport("module", "Name")``, followed to the class
it finally names. ``python -m cudagraph.migrate.sglang_reexports --sglang PATH [--sglang PATH ...] --write``
regenerates it from the ``sglang/`` folders of the releases the real-tree tests fetch; ``--check`` compares, and a
test runs it so the table cannot go stale silently. It holds names only, no code of SGLang's.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

from .api_scan import SourceTree
from .files import write_or_check
from .renames import RenameKind, RenameTable, load_renames

__all__ = ["SGLANG_REEXPORTS_PATH", "load_sglang_reexports", "main", "option_owners", "scan_reexports"]

SGLANG_REEXPORTS_PATH = Path(__file__).with_name("sglang_reexports.json")
"""Where the data lives, in the checkout and in the wheel."""

_SGLANG = "sglang"
_MAX_HOPS = 8
"""Re-exports followed from one name before giving up (SGLang's chains are two or three long)."""


def option_owners(table: RenameTable) -> list[str]:
    """SGLang's classes that take its options: the ``legacy_owners`` of the ``kwarg`` rows that are SGLang's."""
    owners = {owner for row in table.of_kind(RenameKind.KWARG) for owner in row.legacy_owners}
    return sorted(owner for owner in owners if owner.split(".")[0] == _SGLANG)


@functools.lru_cache(maxsize=2)
def load_sglang_reexports(path: Path | None = None) -> Mapping[str, str]:
    """Re-exported qualified name -> the legacy owner it is (default: the file shipped beside this module)."""
    raw = json.loads((path or SGLANG_REEXPORTS_PATH).read_text(encoding="utf-8"))
    return MappingProxyType(dict(raw["reexports"]))


def scan_reexports(packages: Sequence[Path], table: RenameTable | None = None) -> dict[str, object]:
    """``{"owners", "releases", "reexports"}`` read from the ``sglang/`` folders ``packages`` (one per release).

    A name is recorded when a public module (no part starting with ``_``) binds it publicly at run time and it names,
    after every re-export, the class one of the owners names in that release. The owners themselves are not recorded.
    """
    owners = option_owners(table or load_renames())
    found: dict[str, str] = {}
    releases: list[str] = []
    for package in packages:
        tree = SourceTree([package.parent], _SGLANG)
        releases.append(_version(package))
        canonical = _canonical_owners(tree, owners)
        wanted = {qualified.rpartition(".")[2] for qualified in canonical}
        for module in tree.modules():
            if any(part.startswith("_") for part in module.split(".")) or not _mentions(tree, module, wanted):
                continue
            for local, target in sorted(_safe_runtime_imports(tree, module).items()):
                if local.startswith("_") or target.rpartition(".")[2] not in wanted:
                    continue
                owner = canonical.get(_defining(tree, target) or "")
                name = f"{module}.{local}"
                if owner is not None and name not in owners:
                    found.setdefault(name, owner)
    return {"owners": owners, "releases": releases, "reexports": dict(sorted(found.items()))}


def _canonical_owners(tree: SourceTree, owners: Sequence[str]) -> dict[str, str]:
    """Defining qualified name -> the owner to spell it as: the owner that is its own definition where one is, else
    the first owner naming it."""
    by_definition: dict[str, list[str]] = {}
    for owner in owners:
        definition = _defining(tree, owner)
        if definition is not None:
            by_definition.setdefault(definition, []).append(owner)
    return {definition: definition if definition in named else named[0] for definition, named in by_definition.items()}


def _defining(tree: SourceTree, qualified: str, hops: int = 0) -> str | None:
    """Where the class or function ``qualified`` names is defined, following run-time re-exports in the tree."""
    module, _, name = qualified.rpartition(".")
    try:
        found = tree.module_tree(module)
    except (SyntaxError, ValueError):
        return None
    if found is None or hops > _MAX_HOPS:
        return None
    for statement in found[0].body:
        if isinstance(statement, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == name:
            return qualified
    target = _safe_runtime_imports(tree, module).get(name)
    if target is None or target.split(".")[0] != tree.top:
        return None
    return _defining(tree, target, hops + 1)


def _safe_runtime_imports(tree: SourceTree, module: str) -> dict[str, str]:
    try:
        return tree.runtime_imports(module)
    except (SyntaxError, ValueError):  # a file of the release that this interpreter cannot parse
        return {}


def _mentions(tree: SourceTree, module: str, names: set[str]) -> bool:
    """A cheap text test before parsing: the module's file spells one of ``names``."""
    parts = module.split(".")
    for root in tree.roots:
        for candidate in (root.joinpath(*parts).with_suffix(".py"), root.joinpath(*parts, "__init__.py")):
            if candidate.is_file():
                text = candidate.read_text(encoding="utf-8", errors="replace")
                return any(name in text for name in names)
    return False


def _version(package: Path) -> str:
    """The release's ``__version__`` (``sglang/_version.py``, else ``sglang/version.py``), read without importing it."""
    for name in ("_version.py", "version.py"):
        path = package / name
        if not path.is_file():
            continue
        for statement in ast.parse(path.read_bytes()).body:
            if (
                isinstance(statement, ast.Assign)
                and any(isinstance(target, ast.Name) and target.id == "__version__" for target in statement.targets)
                and isinstance(statement.value, ast.Constant)
            ):
                return str(statement.value.value)
    return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cudagraph.migrate.sglang_reexports --sglang PATH [--sglang PATH ...] (--write|--check)``."""
    parser = argparse.ArgumentParser(prog="python -m cudagraph.migrate.sglang_reexports", description=__doc__)
    parser.add_argument(
        "--sglang", type=Path, action="append", required=True, help="the sglang/ package directory of a release"
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"rewrite {SGLANG_REEXPORTS_PATH.name}")
    mode.add_argument("--check", action="store_true", help="exit 1 when the data differs from the sources")
    args = parser.parse_args(argv)
    for package in args.sglang:
        if not (package / "__init__.py").is_file():
            parser.error(f"{package} is not a package directory (no __init__.py); give the sglang/ folder")
    text = json.dumps(scan_reexports(args.sglang), indent=1, sort_keys=True) + "\n"
    hint = f"it differs from {', '.join(map(str, args.sglang))}; regenerate it with --write"
    return write_or_check(SGLANG_REEXPORTS_PATH, text, write=args.write, stale_hint=hint)


if __name__ == "__main__":
    sys.exit(main())
