"""The exports manifest: every public ``cudagraph`` module and the names it exports (its ``__all__``).

The codemods move a name into a new module only when that module exports it, and check every file they write
against this manifest, so a migrated file never imports a name that does not exist. The manifest is a data file
(``exports.json``, shipped in the wheel) because ``cudagraph-migrate`` installs without torch and without the runtime
packages; ``python -m cudagraph.migrate.exports --write`` regenerates it from the source checkout's ``__all__`` lists
(read with :mod:`ast`, nothing imported), and a test compares it with the installed packages so the two cannot drift.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

__all__ = ["MANIFEST_PATH", "MODULE_SOURCES", "ExportsManifest", "load_exports", "main", "scan_sources"]

MANIFEST_PATH = Path(__file__).with_name("exports.json")
"""Where the manifest lives, in the checkout and in the wheel."""

MODULE_SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "cudagraph.config": "packages/cudagraph-config/src/cudagraph/config/__init__.py",
        "cudagraph.backend_utils": "packages/cudagraph-backend-utils/src/cudagraph/backend_utils/__init__.py",
        "cudagraph.backend": "packages/cudagraph-backend/src/cudagraph/backend/__init__.py",
        "cudagraph.runner": "packages/cudagraph-runner/src/cudagraph/runner/__init__.py",
        "cudagraph.engine": "packages/cudagraph-engine/src/cudagraph/engine/__init__.py",
        "cudagraph.legacy": "shims/src/cudagraph/legacy/__init__.py",
    }
)
"""The public modules the manifest covers, and where each one's ``__init__`` lives in a checkout."""

_CHECKOUT_ROOT = Path(__file__).resolve().parents[4]


@dataclass(frozen=True)
class ExportsManifest:
    """Public module -> the names it exports."""

    modules: Mapping[str, frozenset[str]]

    def has_module(self, module: str) -> bool:
        """Whether ``module`` is a public ``cudagraph`` module (or the ``cudagraph`` namespace itself)."""
        return module == "cudagraph" or module in self.modules

    def exports(self, module: str, name: str) -> bool:
        """Whether ``from module import name`` resolves (the namespace ``cudagraph`` exports its modules)."""
        if module == "cudagraph":
            return f"cudagraph.{name}" in self.modules
        return name in self.modules.get(module, frozenset())


@functools.lru_cache(maxsize=4)
def load_exports(path: Path | None = None) -> ExportsManifest:
    """Read the manifest (default: the one shipped beside this module)."""
    raw = json.loads((path or MANIFEST_PATH).read_text(encoding="utf-8"))
    return ExportsManifest(MappingProxyType({module: frozenset(names) for module, names in raw.items()}))


def scan_sources(root: Path = _CHECKOUT_ROOT) -> dict[str, list[str]]:
    """Each covered module's ``__all__``, read statically from the ``__init__.py`` files under ``root``."""
    found: dict[str, list[str]] = {}
    for module, relative in MODULE_SOURCES.items():
        source = root / relative
        tree = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
        names = _dunder_all(tree)
        if names is None:
            raise ValueError(f"{source}: no literal __all__; every public cudagraph module must declare one")
        found[module] = sorted(names)
    return found


def _dunder_all(tree: ast.Module) -> list[str] | None:
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in statement.targets
        ):
            value = ast.literal_eval(statement.value)
            return [str(name) for name in value]
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cudagraph.migrate.exports [--write|--check]``: regenerate or verify the manifest."""
    parser = argparse.ArgumentParser(prog="python -m cudagraph.migrate.exports", description=__doc__)
    parser.add_argument("--root", type=Path, default=_CHECKOUT_ROOT, help="the source checkout")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"rewrite {MANIFEST_PATH.name} from the sources")
    mode.add_argument("--check", action="store_true", help="exit 1 when the manifest differs from the sources")
    args = parser.parse_args(argv)
    text = json.dumps(scan_sources(args.root), indent=1, sort_keys=True) + "\n"
    if args.write:
        MANIFEST_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {MANIFEST_PATH}")
        return 0
    if MANIFEST_PATH.read_text(encoding="utf-8") != text:
        print(f"{MANIFEST_PATH} is stale: run python -m cudagraph.migrate.exports --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
