"""The exports manifest: every public ``cudagraph`` module, the names it exports (its ``__all__``), and the API of
each public class and function (members, method signatures, constructor).

The codemods move a name into a new module only when that module exports it, and check every file they write
against this manifest, so a migrated file never imports a name that does not exist. Before a rewrite that changes
meaning (a base class swapped, a call target or a method renamed), they check against the ``api`` half that the new
API accepts the code as it stands: the members a subclass reads exist, the arguments of a call bind, an override
takes the calls its new base makes. The manifest is a data file (``exports.json``, shipped in the wheel) because
``cudagraph-migrate`` installs without torch and without the runtime packages; ``python -m cudagraph.migrate.exports
--write`` regenerates it from the source checkout (read with :mod:`ast`, nothing imported), and tests compare it with
the installed packages so the two cannot drift.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from .api_scan import SourceTree, signature_of_arguments
from .files import write_or_check
from .signatures import Signature

__all__ = [
    "MANIFEST_PATH",
    "MODULE_SOURCES",
    "ClassApi",
    "ExportsManifest",
    "FunctionApi",
    "load_exports",
    "main",
    "manifest_text",
    "scan_api",
    "scan_sources",
]

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
class ClassApi:
    """A public class: its bases, every member an instance or the class has, and its methods' signatures."""

    qualified: str
    bases: tuple[str, ...]
    members: frozenset[str]
    methods: Mapping[str, Signature]
    open: bool = False
    """Some ancestor lies outside the cudagraph packages and may add members nobody listed here."""

    def has_member(self, name: str) -> bool:
        """Whether an instance or the class has ``name``."""
        return name in self.members

    def method(self, name: str) -> Signature | None:
        """The signature of method ``name`` (with ``self``), if the class has one."""
        return self.methods.get(name)


@dataclass(frozen=True)
class FunctionApi:
    """A public function and its signature."""

    qualified: str
    signature: Signature


@dataclass(frozen=True)
class ExportsManifest:
    """Public module -> the names it exports; public class or function -> its API."""

    modules: Mapping[str, frozenset[str]]
    apis: Mapping[str, ClassApi | FunctionApi] = field(default_factory=lambda: MappingProxyType({}))

    def api(self, qualified: str) -> ClassApi | FunctionApi | None:
        """The members and signatures of ``module.Name``, when the manifest has them."""
        return self.apis.get(qualified)

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
    modules = MappingProxyType({module: frozenset(names) for module, names in raw["modules"].items()})
    apis: dict[str, ClassApi | FunctionApi] = {}
    for qualified, entry in raw["api"].items():
        if entry["kind"] == "function":
            apis[qualified] = FunctionApi(qualified, Signature.from_json(entry["signature"]))
        else:
            methods = {name: Signature.from_json(params) for name, params in entry["methods"].items()}
            apis[qualified] = ClassApi(
                qualified, tuple(entry["bases"]), frozenset(entry["members"]), MappingProxyType(methods), entry["open"]
            )
    return ExportsManifest(modules, MappingProxyType(apis))


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


def scan_api(root: Path = _CHECKOUT_ROOT) -> dict[str, dict[str, object]]:
    """Members and signatures of every public class and function of the covered modules, read with :mod:`ast`."""
    tree = SourceTree(_source_roots(root), "cudagraph")
    api: dict[str, dict[str, object]] = {}
    for module, names in scan_sources(root).items():
        for name in names:
            found = tree.definition(f"{module}.{name}")
            if found is None:
                continue  # a constant, or an alias of something outside the packages: nothing to check calls against
            defining_module, node = found
            if isinstance(node, ast.ClassDef):
                api[f"{module}.{name}"] = {"kind": "class", **tree.class_surface(defining_module, node).to_json()}
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                api[f"{module}.{name}"] = {"kind": "function", "signature": signature_of_arguments(node.args).to_json()}
    return api


def _source_roots(root: Path) -> list[Path]:
    """The ``src`` folders holding the covered modules."""
    roots: list[Path] = []
    for relative in MODULE_SOURCES.values():
        source_root = (root / relative).parents[2]
        if source_root not in roots:
            roots.append(source_root)
    return roots


def manifest_text(root: Path = _CHECKOUT_ROOT) -> str:
    """The manifest file's text for the sources under ``root``."""
    return json.dumps({"modules": scan_sources(root), "api": scan_api(root)}, indent=1, sort_keys=True) + "\n"


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
    hint = "run python -m cudagraph.migrate.exports --write"
    return write_or_check(MANIFEST_PATH, manifest_text(args.root), write=args.write, stale_hint=hint)


if __name__ == "__main__":
    sys.exit(main())
