"""Property: whatever dicts of options a file builds and reads, CG403 lists exactly the statements holding a legacy
option key, and only in a file that imports SGLang; the libcst pass lists what the ``ast`` reading lists; with
``--rewrite-engine-options`` only the keys that cannot become one name stay legacy, and a second run changes nothing.
"""

from __future__ import annotations

import ast
import re

import libcst as cst
from hypothesis import given
from hypothesis import strategies as st
from libcst.codemod import CodemodContext

from cudagraph.migrate.exports import load_exports
from cudagraph.migrate.options import RunOptions
from cudagraph.migrate.renames import RenameKind, load_renames
from cudagraph.migrate.rules import select_rules
from cudagraph.migrate.rules.base import ORIGINAL_KEY, REWRITE_ENGINE_OPTIONS_KEY, FindingKind, QuickView
from cudagraph.migrate.source_migration import migrate_source

TABLE = load_renames()
CG403 = select_rules(["CG403"])
ROWS = {row.old: row for row in TABLE.of_kind(RenameKind.KWARG) if row.legacy_owners}
LEGACY_KEYS = sorted(ROWS)
OTHER_KEYS = ["model_path", "mem_fraction_static", "max_bs", "tp_size"]
ONE_NAME = {name for name, row in ROWS.items() if row.value is None and not row.also}

# Each template holds its keys as {k0}, {k1}, ...; "{v}" is a value. A key-method or subscript template reads or
# writes one key (rewritten only where one name becomes one name); the others build dicts (always rewritten).
BUILDING = [
    "d = {{{k0!r}: {v}, {k1!r}: 1}}",
    "d = dict({k0}={v}, {k1}=2)",
    "d.update({k0}={v})",
]
KEYED = [
    "d.setdefault({k0!r}, {v})",
    "x = d.get({k0!r})",
    "x = d.pop({k0!r}, None)",
    "d[{k0!r}] = {v}",
    "x = d[{k0!r}]",
]


def _a_key_stays(items: list[tuple[str, str]]) -> bool:
    """Whether a dict built from ``items`` keeps a legacy key after the rewrite: a valued option whose value is not a
    literal True/False, or one whose new key the dict already holds with another value (both with a TODO)."""
    given = {key: value for key, value in items if key not in ROWS}
    stays = False
    for key, value in items:
        row = ROWS.get(key)
        if row is None:
            continue
        if row.value is None:
            new = [(target, value) for target in row.targets]
        elif value in ("True", "False"):
            new = [(target, repr(row.value)) for target in row.targets] if value == "True" else []
        else:
            stays = True
            continue
        for target, code in new:
            if given.setdefault(target, code) != code:
                stays = True
                break
    return stays


@st.composite
def statement(draw: st.DrawFn) -> tuple[str, bool, bool]:
    """One statement, whether it holds a legacy key, and whether that key stays legacy after the opt-in rewrite."""
    template = draw(st.sampled_from(BUILDING + KEYED))
    keys = draw(st.lists(st.sampled_from(LEGACY_KEYS + OTHER_KEYS), min_size=2, max_size=2, unique=True))
    value = draw(st.sampled_from(["True", "False", "8", "cfg.flag"]))
    code = template.format(k0=keys[0], k1=keys[1], v=value)
    used = [keys[0]] if template in KEYED else keys[: template.count("{k")]
    values = dict(zip(used, [value, "1"], strict=False))  # the second key of a building template holds a number
    legacy = [key for key in used if key in ROWS]
    if template in KEYED:
        stays = bool(legacy) and legacy[0] not in ONE_NAME
    else:
        stays = _a_key_stays([(key, values[key]) for key in used])
    return code.replace("'", '"'), bool(legacy), stays


@st.composite
def option_file(draw: st.DrawFn) -> tuple[str, list[tuple[int, bool, bool]]]:
    """A function building and reading a dict; the lines (in the file) of its statements, with their facts."""
    imports = draw(st.sampled_from(["import sglang\n", "from sglang.srt.server_args import ServerArgs\n", ""]))
    statements = draw(st.lists(statement(), min_size=1, max_size=6))
    header = f"{imports}\n\ndef build(cfg, d):\n"
    first = header.count("\n") + 1
    body = "".join(f"    {code}\n" for code, _, _ in statements)
    facts = [(first + index, legacy, stays) for index, (_, legacy, stays) in enumerate(statements)]
    return header + body + "    return d\n", facts


def _listed_lines(result_findings: list) -> set[int]:
    return {finding.line for finding in result_findings if finding.kind is FindingKind.ARGV}


@given(option_file())
def test_exactly_the_statements_with_a_legacy_key_are_listed_in_a_file_that_imports_sglang(
    case: tuple[str, list[tuple[int, bool, bool]]],
) -> None:
    source, facts = case
    result = migrate_source(source, "rl/build.py", CG403, TABLE, RunOptions())
    imports_sglang = "sglang" in source
    assert _listed_lines(result.findings) == {line for line, legacy, _ in facts if legacy and imports_sglang}
    assert not result.changed


@given(option_file())
def test_the_libcst_pass_lists_what_the_ast_reading_lists(case: tuple[str, list[tuple[int, bool, bool]]]) -> None:
    source, _ = case
    view = QuickView(ast.parse(source), source, "rl/build.py", TABLE, rewrite_argv=False, imported=frozenset())
    quick = CG403[0].command.quick_findings(view)
    assert quick is not None
    tree = cst.parse_module(source)
    scratch = {REWRITE_ENGINE_OPTIONS_KEY: False, ORIGINAL_KEY: (tree, source)}
    command = CG403[0].command(CodemodContext(filename="rl/build.py", scratch=scratch), TABLE, load_exports())
    assert command.transform_module(tree).code == source
    assert sorted(map(str, command.findings)) == sorted(map(str, quick))


@given(option_file())
def test_the_opt_in_rewrite_leaves_only_what_cannot_become_one_name(
    case: tuple[str, list[tuple[int, bool, bool]]],
) -> None:
    source, facts = case
    options = RunOptions(rewrite_engine_options=True)
    first = migrate_source(source, "rl/build.py", CG403, TABLE, options)
    migrated = first.migrated.decode()
    ast.parse(migrated)
    if "sglang" not in source:
        assert migrated == source
        return
    lines = migrated.splitlines()
    body = [line for line in lines if line.startswith("    ") and not line.lstrip().startswith("#")][:-1]
    assert len(body) == len(facts)
    for line, (_, legacy, stays) in zip(body, facts, strict=True):
        left = {key for key in re.findall(r"\b\w+\b", line) if key in ROWS}
        assert bool(left) == (legacy and stays), line
    again = migrate_source(migrated, "rl/build.py", CG403, TABLE, options)
    assert again.migrated.decode() == migrated and again.edits == {}
