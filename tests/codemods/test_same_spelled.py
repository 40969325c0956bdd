"""Same-spelled names left alone, places maybe tied to a legacy engine, and config fields named like legacy options.

Every place spelled like a row of a rule tied to owners is listed, with file and line: as not tied (``skip``, ``-v``),
or, in a file tied to a legacy engine where the receiver's type is unknown, for review as maybe tied. Where a file
reaches no owner the places are read off the :mod:`ast` tree (libcst never runs for the rule), and that reading must
say exactly what the libcst visit says where it does run.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cudagraph.migrate.command import EXIT_CHANGES, EXIT_OK, main
from cudagraph.migrate.options import RunOptions
from cudagraph.migrate.renames import RenameKind, load_renames
from cudagraph.migrate.rules import RULES
from cudagraph.migrate.rules.base import FindingKind, ties_to_legacy_engine
from cudagraph.migrate.source_migration import migrate_source

from .fixture_cases import discover_cases

TABLE = load_renames()
CASES = {case.name: case for case in discover_cases()}
OWNER_IMPORTS = "\nimport cudagraph.config\nimport cudagraph.engine\nimport cudagraph.runner\n"
"""Appended to a file, these make every owner reachable (so the rules run libcst) without moving a line."""
LISTING_RULES = ("CG201", "CG301", "CG302", "CG401")
MEMBER_KINDS = (RenameKind.ATTRIBUTE, RenameKind.METHOD)


def _findings(name: str, *kinds: FindingKind) -> list[tuple[str, int]]:
    case = CASES[name]
    result = case.migrate(case.source.read_text())
    return [(finding.code, finding.line) for finding in result.findings if finding.kind in kinds]


def _listed(source: str, path: str = "pkg/module.py") -> list[tuple[str, str]]:
    result = migrate_source(source, path, RULES, TABLE, RunOptions())
    return sorted(
        (finding.kind.value, str(finding))
        for finding in result.findings
        if finding.kind in (FindingKind.SKIP, FindingKind.MAYBE) and finding.code in LISTING_RULES
    )


def test_a_file_is_tied_to_a_legacy_engine_by_what_it_imports() -> None:
    assert ties_to_legacy_engine({"sglang.srt.server_args", "sglang.srt.server_args.ServerArgs"}, TABLE)
    assert ties_to_legacy_engine({"sglang"}, TABLE)
    assert ties_to_legacy_engine({"pymllm.executor.cuda_graph_runner"}, TABLE)
    # cudagraph's own shims are ours, and a package merely named like SGLang is not SGLang
    assert not ties_to_legacy_engine({"cudagraph.legacy.cuda_graph_runner", "cudagraph.engine.ModelRunner"}, TABLE)
    assert not ties_to_legacy_engine({"sglang_router.launch", "os"}, TABLE)


def test_unknown_receivers_in_a_file_tied_to_sglang_are_maybe_tied_known_ones_not_tied() -> None:
    assert _findings("members_maybe_tied", FindingKind.MAYBE) == [("CG201", line) for line in (19, 22, 29, 30, 31)]
    assert _findings("members_maybe_tied", FindingKind.SKIP) == [("CG201", 25), ("CG201", 32)]
    assert _findings("members_maybe_tied", FindingKind.TODO) == []
    maybe = [
        str(f) for f in CASES["members_maybe_tied"].migrate(CASES["members_maybe_tied"].source.read_text()).findings
    ]
    assert any(".graph_runner: maybe tied" in line and "decode_cuda_graph_runner" in line for line in maybe)
    assert any(".init_device_graphs: maybe tied" in line and "init_decode_cuda_graph" in line for line in maybe)


def test_name_strings_follow_the_attribute_rule_and_unknown_receivers_are_maybe_tied() -> None:
    # the expected output (members_maybe_tied_typed.out.py) holds the rewrite of ours and the TODO on SGLang's
    assert _findings("members_maybe_tied_typed", FindingKind.MAYBE) == [("CG201", 14), ("CG201", 28)]
    assert _findings("members_maybe_tied_typed", FindingKind.TODO) == [("CG201", 18)]


def test_config_fields_named_like_legacy_options_are_listed_in_files_tied_to_sglang() -> None:
    # a dataclass, an attrs class, a pydantic model, a NamedTuple; not a plain class, not a non-option field
    assert _findings("option_fields", FindingKind.MAYBE) == [("CG404", line) for line in (17, 18, 19, 25, 29, 33)]
    case = CASES["option_fields"]
    result = case.migrate(case.source.read_text())
    assert not result.changed
    messages = [str(finding) for finding in result.findings if finding.code == "CG404"]
    assert "decode_cuda_graph_max_bs (flags: --decode-cuda-graph-max-bs)" in messages[1]
    assert 'prefill_cuda_graph_backend="breakable" (flags: --prefill-cuda-graph-backend breakable)' in messages[3]


def test_config_fields_are_not_listed_where_the_file_does_not_import_a_legacy_engine() -> None:
    source = CASES["option_fields"].source.read_text().replace("import sglang\n", "").replace("sglang.Engine", "E")
    result = migrate_source(source, "pkg/config.py", RULES, TABLE, RunOptions())
    assert [finding for finding in result.findings if finding.code == "CG404"] == []


def test_sglangs_own_definition_of_its_options_is_not_listed() -> None:
    source = "\n".join(
        [
            "import dataclasses",
            "import sglang",
            "",
            "@dataclasses.dataclass",
            "class ServerArgs:",
            "    cuda_graph_max_bs: int = 8",
        ]
    )
    own = migrate_source(source, "sglang/srt/server_args.py", RULES, TABLE, RunOptions())
    elsewhere = migrate_source(source, "plugin/server_args.py", RULES, TABLE, RunOptions())
    assert [finding for finding in own.findings if finding.code == "CG404"] == []
    assert [(finding.code, finding.line) for finding in elsewhere.findings if finding.code == "CG404"] == [("CG404", 6)]


def test_a_second_engine_comes_out_unchanged_with_every_same_spelled_name_listed() -> None:
    case = CASES["second_engine"]
    source = case.source.read_text()
    result = case.migrate(source)
    assert not result.changed
    skips = {(finding.code, finding.line) for finding in result.findings if finding.kind is FindingKind.SKIP}
    assert [finding for finding in result.findings if finding.kind in (FindingKind.TODO, FindingKind.MAYBE)] == []
    # independently: every line where a member, enum member, config value or keyword of a rule's row is spelled
    tree = ast.parse(source)
    members = {row.old for row in TABLE.of_kind(*MEMBER_KINDS)}
    spelled = {(code, node.lineno) for node in ast.walk(tree) if (code := _spelled_by(node, members, tree))}
    assert spelled and skips == spelled


def _spelled_by(node: ast.AST, members: set[str], tree: ast.Module) -> str | None:
    """The rule whose row ``node`` spells (a member used or defined, a name string, an enum member, a config value,
    a keyword), or None."""
    name_string = (
        node.args[1].value
        if isinstance(node, ast.Call) and node.args[1:] and isinstance(node.args[1], ast.Constant)
        else None
    )
    checks = (
        ("CG201", isinstance(node, ast.Attribute) and node.attr in members),
        ("CG201", isinstance(node, (ast.FunctionDef, ast.Assign)) and _defines_member(node, members, tree)),
        ("CG201", name_string in members),
        ("CG301", isinstance(node, ast.Attribute) and node.attr == "TCPIECEWISE"),
        ("CG302", isinstance(node, ast.Constant) and node.value == "tcpiecewise"),
        ("CG401", isinstance(node, ast.Call) and any(keyword.arg == "cuda_graph_max_bs" for keyword in node.keywords)),
    )
    return next((code for code, found in checks if found), None)


def _defines_member(node: ast.FunctionDef | ast.Assign, members: set[str], tree: ast.Module) -> bool:
    in_class_body = any(isinstance(parent, ast.ClassDef) and node in parent.body for parent in ast.walk(tree))
    names = (
        [node.name] if isinstance(node, ast.FunctionDef) else [t.id for t in node.targets if isinstance(t, ast.Name)]
    )
    return in_class_body and bool(set(names) & members)


def test_the_ast_reading_says_what_the_libcst_visit_says_on_every_fixture() -> None:
    compared = 0
    for case in CASES.values():
        if case.switch or not case.source.name.endswith(".in.py"):
            continue
        source = case.source.read_text()
        quick, full = _listed(source, case.virtual_path), _listed(source + OWNER_IMPORTS, case.virtual_path)
        assert quick == full, case.name
        compared += bool(quick)
    assert compared >= 5


# --- property: whatever the receiver and the use, both readings agree ---

RECEIVERS = {
    "self": "self",
    "annotated": "engine",
    "unannotated": "worker",
    "assigned_call": "built",
    "attribute_chain": "worker.model_runner",
    "local_class": "Local",
    "imported": "helpers",
    "call": "Local()",
    "lambda_param": "(lambda item: item.{member})(worker)",
}
USES = ("{receiver}.{member}", 'getattr({receiver}, "{member}", None)', "{receiver}.{member}()")


@st.composite
def snippets(draw: st.DrawFn) -> tuple[str, str]:
    member = draw(st.sampled_from(sorted(row.old for row in TABLE.of_kind(*MEMBER_KINDS))))
    tied = draw(st.booleans())
    lines = ["import helpers", "from sglang.srt.server_args import ServerArgs" if tied else "import os", ""]
    lines += ["class Local:", "    pass", "", "", "class Engine:"]
    if draw(st.booleans()):
        lines.append(f"    {member} = None")
    lines += ["    def run(self, engine: Local, worker):", "        built = Local()"]
    for receiver_kind in draw(st.lists(st.sampled_from(sorted(RECEIVERS)), min_size=1, max_size=4)):
        receiver = RECEIVERS[receiver_kind]
        if receiver_kind == "lambda_param":
            lines.append(f"        {receiver.format(member=member)}")
            continue
        lines.append(f"        {draw(st.sampled_from(USES)).format(receiver=receiver, member=member)}")
    return member, "\n".join(lines) + "\n"


@given(snippets())
def test_property_the_ast_reading_agrees_with_libcst_on_any_receiver(snippet: tuple[str, str]) -> None:
    member, source = snippet
    quick, full = _listed(source), _listed(source + OWNER_IMPORTS)
    assert quick == full
    uses = sum(line.count(f".{member}") + line.count(f'"{member}"') for line in source.splitlines()[8:])
    defined = f"    {member} = None" in source
    assert len([item for item in quick if item[1].startswith("CG201")]) == uses + defined


# --- the command line keeps the report's word ---


def test_verbose_lists_every_name_left_alone_in_a_second_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = tmp_path / "engine" / "runner.py"
    engine.parent.mkdir()
    shutil.copy(CASES["second_engine"].source, engine)
    assert main([str(engine.parent), "--check", "--no-progress", "-v"]) == EXIT_OK
    err = capsys.readouterr().err
    skipped = re.findall(rf"^skip: {re.escape(str(engine))}:(\d+): (CG\d+) ", err, flags=re.MULTILINE)
    expected = _findings("second_engine", FindingKind.SKIP)
    assert sorted((code, int(line)) for line, code in skipped) == sorted(expected)
    assert f"not tied to the legacy API: {len(expected)} (-v lists them)" in err
    assert engine.read_text() == CASES["second_engine"].source.read_text()
    assert main([str(engine.parent), "--check", "--no-progress"]) == EXIT_OK
    quiet = capsys.readouterr().err
    assert "skip: " not in quiet and f"not tied to the legacy API: {len(expected)}" in quiet


def test_places_maybe_tied_are_listed_for_review_without_verbose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    worker = tmp_path / "worker.py"
    shutil.copy(CASES["members_maybe_tied"].source, worker)
    assert main([str(worker), "--check", "--no-progress"]) == EXIT_OK
    err = capsys.readouterr().err
    reviewed = re.findall(rf"^review: {re.escape(str(worker))}:(\d+): CG201 \.\w+: maybe tied", err, flags=re.MULTILINE)
    assert [int(line) for line in reviewed] == [19, 22, 29, 30, 31]
    assert "maybe tied to the legacy API: 5 place(s)" in err
    # not a manual step, but a legacy spelling left: --strict fails until someone has looked at each
    assert main([str(worker), "--check", "--strict", "--no-progress"]) == EXIT_CHANGES
    assert "accounted: 7 of 7 legacy spellings (0 rewritten, 0 TODOs, 7 listed)" in capsys.readouterr().err
