"""Property: whatever import statements over legacy modules a file holds, the migrated file parses, every
``cudagraph`` name it imports exists, every name it uses is still bound, and a second migration changes nothing."""

from __future__ import annotations

import ast
import builtins

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cudagraph.migrate.exports import load_exports
from cudagraph.migrate.options import RunOptions
from cudagraph.migrate.renames import load_renames
from cudagraph.migrate.rules import RULES
from cudagraph.migrate.source_migration import migrate_source
from cudagraph.migrate.verify import unresolved_references

TABLE = load_renames()
EXPORTS = load_exports()
LEGACY_MODULES = sorted(TABLE.modules)
PATH = "engine/sglang/srt/model_executor/worker.py"
"""Where the generated file pretends to live: relative imports of SGLang's modules resolve from here."""
FOREIGN_NAMES = ("_allocate_decode_buffers", "set_torch_compile_config", "LogitsProcessorOutput", "helper")


@st.composite
def names_of(draw: st.DrawFn, module: str) -> list[tuple[str, str | None]]:
    row = TABLE.modules[module]
    candidates = sorted(
        {symbol.old_name for symbol in TABLE.symbols_of(module)}
        | set(list(sorted(EXPORTS.modules.get(row.new, frozenset())))[:6])
        | set(FOREIGN_NAMES)
    )
    chosen = draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=5, unique=True))
    return [(name, draw(st.sampled_from([None, f"{name}_alias"]))) for name in chosen]


@st.composite
def import_statement(draw: st.DrawFn) -> tuple[str, list[str], list[str]]:
    """One statement: its code, the names it binds, and the module bindings (used as ``m.attr``)."""
    module = draw(st.sampled_from(LEGACY_MODULES))
    form = draw(st.sampled_from(["from", "relative", "module_alias", "from_package", "star"]))
    if form == "relative" and not module.startswith("sglang.srt.model_executor."):
        form = "from"
    if form in ("from", "relative"):
        names = draw(names_of(module))
        spelled = ", ".join(f"{name} as {alias}" if alias else name for name, alias in names)
        source = "." + module.rpartition(".")[2] if form == "relative" else module
        return f"from {source} import {spelled}", [alias or name for name, alias in names], []
    if form == "star":
        return f"from {module} import *", [], []
    binding = draw(st.sampled_from(["m", "legacy_mod"]))
    parent, _, last = module.rpartition(".")
    code = f"import {module} as {binding}" if form == "module_alias" else f"from {parent} import {last} as {binding}"
    return code, [], [binding]


@st.composite
def legacy_file(draw: st.DrawFn) -> str:
    statements = draw(st.lists(import_statement(), min_size=1, max_size=4))
    lines = [code for code, _, _ in statements]
    lines.append("")
    for _, bound, modules in statements:
        lines.extend(f"use({name})" for name in bound)
        for binding in modules:
            attribute = draw(st.sampled_from([*FOREIGN_NAMES, "CudaGraphRunner", "freeze_gc", "ForwardContext"]))
            lines.append(f"use({binding}.{attribute})")
    return "\n".join(lines) + "\n"


def _migrate(text: str) -> bytes:
    return migrate_source(text, PATH, RULES, TABLE, RunOptions()).migrated


def _unbound_names(source: bytes) -> set[str]:
    tree = ast.parse(source)
    bound = {"use"} | set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).partition(".")[0] for alias in node.names)
    if any(isinstance(node, ast.ImportFrom) and node.names[0].name == "*" for node in ast.walk(tree)):
        return set()  # a star import may bind anything
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id not in bound}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(legacy_file())
def test_migrated_imports_parse_resolve_stay_bound_and_are_stable(text: str) -> None:
    migrated = _migrate(text)
    ast.parse(migrated)
    assert unresolved_references(text, migrated, EXPORTS) == []
    assert _unbound_names(migrated) == set()
    assert _migrate(migrated.decode()) == migrated
