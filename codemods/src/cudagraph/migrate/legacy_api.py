"""What the legacy engine's classes and functions looked like: members and signatures, read from its released source.

The exports manifest (:mod:`.exports`) says what the new API has; this says what the legacy one had, so a rewrite
can be checked in both directions: an override of a legacy hook that the new base class never calls, or a call whose
arguments bind to the new signature but mean something else there (``get_batch_sizes_to_capture(model_runner)`` is
``(config)`` now), is left as written with a TODO instead of being rewritten.

The data (``legacy_api.json``, shipped in the wheel) holds names and signatures only, read statically with
:mod:`ast` from SGLang's released sources (the symbol rows' legacy modules and the ``legacy_owners`` classes):
``python -m cudagraph.migrate.legacy_api --sglang PATH/TO/sglang --write`` regenerates it, ``--check`` compares.
A name this file does not know (pymllm's copy, the ``cudagraph.legacy`` shims, whose objects *are* the new ones) is
checked against the new API alone.
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

from .api_scan import SourceTree, signature_of_arguments
from .files import write_or_check
from .renames import RenameKind, RenameTable, load_renames
from .signatures import Signature

__all__ = ["LEGACY_API_PATH", "LegacyApi", "LegacyClass", "load_legacy_api", "main", "scan_sglang"]

LEGACY_API_PATH = Path(__file__).with_name("legacy_api.json")
"""Where the data lives, in the checkout and in the wheel."""

_SGLANG = "sglang"


@dataclass(frozen=True)
class LegacyClass:
    """A legacy class: every member it has (methods, class attributes, ``self.X`` it assigns) and its methods."""

    members: frozenset[str]
    methods: Mapping[str, Signature]


@dataclass(frozen=True)
class LegacyApi:
    """Legacy qualified name -> a class's surface or a function's signature."""

    classes: Mapping[str, LegacyClass]
    functions: Mapping[str, Signature]

    def constructor(self, qualified: str) -> Signature | None:
        """The call signature of a legacy class (``__init__`` without ``self``) or function, if known."""
        if qualified in self.functions:
            return self.functions[qualified]
        legacy_class = self.classes.get(qualified)
        init = legacy_class.methods.get("__init__") if legacy_class else None
        return init.without_first() if init is not None else None


@functools.lru_cache(maxsize=2)
def load_legacy_api(path: Path | None = None) -> LegacyApi:
    """Read the data (default: the file shipped beside this module)."""
    raw = json.loads((path or LEGACY_API_PATH).read_text(encoding="utf-8"))
    classes = {
        name: LegacyClass(
            frozenset(entry["members"]),
            MappingProxyType({method: _signature(params) for method, params in entry["methods"].items()}),
        )
        for name, entry in raw["classes"].items()
    }
    functions = {name: _signature(params) for name, params in raw["functions"].items()}
    return LegacyApi(MappingProxyType(classes), MappingProxyType(functions))


def _signature(params: Sequence[Sequence[object]]) -> Signature:
    return Signature.from_json(params)


# --- reading the legacy sources ------------------------------------------------------------------------------------


def legacy_names(table: RenameTable) -> list[str]:
    """The legacy qualified names of SGLang the table moves or names as owners."""
    names = {row.old for row in table.of_kind(RenameKind.SYMBOL)}
    names |= {owner for row in table for owner in row.legacy_owners}
    return sorted(name for name in names if name.split(".")[0] == _SGLANG)


def scan_sglang(package: Path, table: RenameTable | None = None) -> dict[str, dict[str, object]]:
    """``{"classes": ..., "functions": ...}`` for every legacy name of the table found under ``package`` (the
    ``sglang/`` directory of a release)."""
    table = table or load_renames()
    tree = SourceTree([package.parent], _SGLANG)
    classes: dict[str, object] = {}
    functions: dict[str, object] = {}
    for qualified in legacy_names(table):
        found = tree.definition(qualified)
        if found is None:
            continue
        module, node = found
        if isinstance(node, ast.ClassDef):
            surface = tree.class_surface(module, node).to_json()
            classes[qualified] = {"members": surface["members"], "methods": surface["methods"]}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions[qualified] = signature_of_arguments(node.args).to_json()
    return {"classes": classes, "functions": functions}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cudagraph.migrate.legacy_api --sglang PATH (--write|--check)``."""
    parser = argparse.ArgumentParser(prog="python -m cudagraph.migrate.legacy_api", description=__doc__)
    parser.add_argument("--sglang", type=Path, required=True, help="the sglang/ package directory of a release")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"rewrite {LEGACY_API_PATH.name}")
    mode.add_argument("--check", action="store_true", help="exit 1 when the data differs from the sources")
    args = parser.parse_args(argv)
    if not (args.sglang / "__init__.py").is_file():
        parser.error(f"{args.sglang} is not a package directory (no __init__.py); give the sglang/ folder")
    text = json.dumps(scan_sglang(args.sglang), indent=1, sort_keys=True) + "\n"
    hint = f"it differs from {args.sglang}; regenerate it with --write"
    return write_or_check(LEGACY_API_PATH, text, write=args.write, stale_hint=hint)


if __name__ == "__main__":
    sys.exit(main())
