"""Every fixture pair, asserted exactly; every expected output parses and migrates to itself; every row is covered.

Module and symbol rows are covered by the generated cases (``row_cases.py``); the pairs here are the tricky cases.
"""

from __future__ import annotations

import ast

import libcst as cst
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cudagraph.migrate.options import RunOptions
from cudagraph.migrate.renames import Rename, RenameKind, load_renames
from cudagraph.migrate.rules import RULES
from cudagraph.migrate.rules.base import FindingKind
from cudagraph.migrate.source_migration import migrate_source
from cudagraph.migrate.todo_comments import TODO_MARKER, todo_comments_in

from .fixture_cases import (
    FIXTURES,
    FixtureCase,
    StaleDiff,
    apply_diff,
    covers,
    diff_from,
    discover_cases,
    expected_diff_path,
    expected_outputs,
)

CASES = discover_cases()


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_fixture_migrates_to_expected(case: FixtureCase) -> None:
    result = case.migrate(case.source.read_text())
    assert result.migrated.decode() == case.expected


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_expected_output_parses(case: FixtureCase) -> None:
    text = case.expected
    cst.parse_module(text)
    ast.parse(text)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_second_run_changes_nothing(case: FixtureCase) -> None:
    text = case.expected
    result = case.migrate(text)
    assert result.migrated.decode() == text
    assert result.edits == {}


def test_every_expected_output_has_its_input() -> None:
    """A stored output is a case of an input (``NAME`` or ``NAME.SWITCH``), so none is silently never compared."""
    assert expected_outputs() <= {case.name for case in CASES}


def test_expected_outputs_are_stored_as_diffs() -> None:
    """A whole ``NAME.out.py`` would be read by no case: the expected output is stored as ``NAME.out.diff``."""
    assert sorted(path.name for path in FIXTURES.glob("*.out.py")) == []


def test_an_input_edited_without_its_diff_fails_by_name() -> None:
    (case,) = [case for case in CASES if case.name == "kwargs"]
    diff = expected_diff_path(case.source).read_text()
    edited = case.source.read_text().replace("a = resolve(disable_cuda_graph=True)", "a = resolve()")
    with pytest.raises(StaleDiff, match=r"kwargs.out.diff: line 7 of the input is '    a = resolve\(\)\\n'"):
        apply_diff(edited, diff, "kwargs.out.diff")


LINES = st.lists(st.sampled_from(["a\n", "b\n", "\n", "    c\n", "-d\n", "+e\n", "@@ f\n", "--- g\n"]), max_size=30)


@given(source=LINES, expected=LINES)
def test_a_stored_diff_gives_back_the_expected_output(source: list[str], expected: list[str]) -> None:
    source_text, expected_text = "".join(source), "".join(expected)
    assert apply_diff(source_text, diff_from(source_text, expected_text, "x.in.py", "x.out.py")) == expected_text


HAND_WRITTEN_ROWS = [row for row in load_renames() if row.kind not in (RenameKind.MODULE, RenameKind.SYMBOL)]
"""Module and symbol rows are exercised by the generated cases of ``row_cases.py`` (``test_row_cases.py``)."""


@pytest.mark.parametrize("row", HAND_WRITTEN_ROWS, ids=lambda row: f"{row.kind.value}:{row.old}")
def test_every_row_has_a_fixture(row: Rename) -> None:
    pairs = [(case.source.read_text(), case.expected) for case in CASES]
    assert any(covers(row, source, expected) for source, expected in pairs), f"no fixture exercises {row}"


IMPORT_FORMS = {
    "from_import_alias": "from a import (b as c, d)",
    "from_import_single_line": "from a import b, c  # comment",
    "import_module_plain": "import a.b",
    "import_module_mixed": "import x, a.b as c",
    "from_package_import_module": "from a import module",
    "relative_vendored": "relative imports in a vendored copy",
    "split_import": "names of one legacy module split over new modules",
    "merge_imports": "names of several legacy modules merged into one",
    "merge_existing_new_import": "a name already imported from its new home",
    "nested_imports": "imports inside functions and TYPE_CHECKING",
    "string_annotations": "string annotations",
    "mock_patch_strings": "mock.patch strings",
    "dunder_all": "__all__",
    "forward_context_own": "an engine's own ForwardContext",
    "name_taken": "the new name already bound",
    "star_import": "star import",
}


LEFT_AS_WRITTEN = {"forward_context_own", "star_import"}
"""Forms whose point is that the codemod leaves them alone (an engine's own names; what it cannot rewrite safely)."""


@pytest.mark.parametrize("name", sorted(IMPORT_FORMS))
def test_every_import_form_has_a_fixture_the_codemod_acts_on(name: str) -> None:
    (case,) = [case for case in CASES if case.name == name]
    result = case.migrate(case.source.read_text())
    assert result.changed is (name != "forward_context_own"), IMPORT_FORMS[name]
    if name in LEFT_AS_WRITTEN:
        assert result.edits == {}, IMPORT_FORMS[name]


def test_the_engines_own_forward_context_is_untouched() -> None:
    (own,) = [case for case in CASES if case.name == "forward_context_own"]
    (piecewise,) = [case for case in CASES if case.name == "forward_context_piecewise"]
    assert own.expected == own.source.read_text()
    migrated = piecewise.expected
    assert "from cudagraph.backend_utils import ForwardContext" in migrated
    assert "engine_forward_context.ForwardContext()" in migrated


HANDOFF_FIXTURES = frozenset(
    {
        "handoff_values",
        "patched_classes",
        "patch_object_module_alias",
        "import_fallbacks",
        "import_fallback_patched",
        "dotted_member_strings",
        "eagle_draft_runners",
        "eagle_fork_draft_runners",
    }
)
"""Fixtures of hand-offs, patches, fallbacks and member strings whose TODOs ``test_handoffs.py`` checks."""


def _notes(case: FixtureCase) -> list[str]:
    return [str(f) for f in case.migrate(case.source.read_text()).findings if f.kind is FindingKind.TODO]


def test_what_cannot_be_rewritten_safely_is_reported() -> None:
    notes = {case.name: _notes(case) for case in CASES}
    assert notes["star_import"] == [
        "CG101 3: star import from sglang.srt.model_executor.cuda_graph_runner: import the names you use from their "
        "new modules"
    ]
    assert notes["kwargs"] == [
        "CG401 22: enable_breakable_cuda_graph=flag is not a literal True/False; "
        "set prefill_cuda_graph_backend= by hand",
        "CG401 24: disable_piecewise_cuda_graph= conflicts with prefill_disable_cuda_graph=False; left as written",
    ]
    assert notes["unexported_names_stay"] == [
        "CG101 3: _allocate_decode_buffers, set_torch_compile_config: not exported by cudagraph.runner and not in the "
        "rename table; kept on sglang.srt.model_executor.cuda_graph_runner",
        "CG101 3: CudaGraphRunner: kept on sglang.srt.model_executor.cuda_graph_runner, since "
        "cudagraph.runner.DecodeCudaGraphRunner does not accept every use of it here (see the TODOs at those uses)",
        "CG101 3: get_batch_sizes_to_capture: kept on sglang.srt.model_executor.cuda_graph_runner, since "
        "cudagraph.runner.get_batch_sizes_to_capture does not accept every use of it here (see the TODOs at those "
        "uses)",
        "CG101 9: LogitsProcessorOutput: not exported by cudagraph.runner and not in the rename table; kept on "
        "sglang.srt.model_executor.cuda_graph_runner",
        "CG101 17: kept on the legacy get_batch_sizes_to_capture: argument 1 is 'model_runner' of the legacy "
        "get_batch_sizes_to_capture but 'config' of get_batch_sizes_to_capture(config)",
        "CG101 19: sglang.srt.model_executor.cuda_graph_runner.get_pcg_capture_stream: cudagraph.runner has no such "
        "name; left as written",
        "CG101 20: kept on the legacy CudaGraphRunner: DecodeCudaGraphRunner(model_runner, config, *, backend=..., "
        "show_progress=..., num_warmups=..., capture_barrier=..., metrics=..., query_len=...) does not take this "
        "call: missing "
        "required argument 'config'",
        "CG101 20: bcg is used as a module object; the legacy import stays",
    ]
    shared = "it shares state (capture flag, graph pool or forward context) with that engine's graph runner, which "
    shared += "still sets it; move it with the runner (--move-shared-state)"
    assert notes["forward_context_piecewise"] == [
        f"CG101 3: set_forward_context stays on sglang.srt.compilation.piecewise_context_manager: {shared}"
    ]
    assert notes["shared_state_stays"] == [
        f"CG101 4: get_global_graph_memory_pool stays on sglang.srt.model_executor.cuda_graph_runner: {shared}",
        f"CG101 4: get_is_capture_mode stays on sglang.srt.model_executor.cuda_graph_runner: {shared}",
    ]
    assert notes["engine_option_dicts.rewrite-engine-options"] == [
        "CG403 24: enable_breakable_cuda_graph=flag is not a literal True/False; "
        "set prefill_cuda_graph_backend= by hand"
    ]
    assert notes["own_runner_methods"] == [
        "CG201 54: capture_bucket's parameter is bucket, but bucket already names something else in this override: "
        "its parameter stays shape",
        "CG201 63: BothNames defines both replay_routed and replay: merge them into replay",
    ]
    expected_elsewhere = {
        "own_runner_methods",
        "engine_option_dicts.rewrite-engine-options",
        "star_import",
        "kwargs",
        "unexported_names_stay",
        "forward_context_piecewise",
        "shared_state_stays",
        *HANDOFF_FIXTURES,  # their TODOs are checked in test_handoffs.py
        "members_maybe_tied_typed",  # test_same_spelled checks its TODO
    }
    assert all(not found for name, found in notes.items() if name not in expected_elsewhere)


def test_names_not_tied_to_the_legacy_api_are_listed_not_rewritten() -> None:
    skips = {
        case.name: [str(f) for f in case.migrate(case.source.read_text()).findings if f.kind is FindingKind.SKIP]
        for case in CASES
    }
    assert skips["attributes_tied"] == [
        "CG201 36: .graph_runner: receiver not tied to cudagraph.engine.ModelRunner, "
        "cudagraph.legacy.LegacyAliasesMixin; left as written"
    ]
    assert skips["other_programs_keywords"] == [  # another program's ServerArgs, and an unknown callee
        "CG401 8: enable_breakable_cuda_graph=: callee not tied to cudagraph.config.resolve; left as written",
        "CG401 9: disable_cuda_graph=: callee not tied to cudagraph.config.resolve; left as written",
    ]
    own = next(case for case in CASES if case.name == "attributes_own_classes")
    assert own.expected == own.source.read_text()
    # -v names every member spelled like a legacy one that the engine's own classes define or use, read off the ast
    # tree (the file reaches no owner): definitions, attribute uses, name strings, patch.object; not a local function
    assert sorted({int(skip.split()[1].rstrip(":")) for skip in skips["attributes_own_classes"]}) == [
        *(11, 12, 14, 15, 17, 18, 24, 26),
        *(34, 35, 36, 37, 38, 39, 49),
    ]


_OWN_DEFINITION = (
    "CG402 21: defines legacy flag --cuda-graph-bs: this program's own parser, not SGLang's ServerArgs.add_cli_args; "
    "left alone"
)


def test_argv_lists_are_listed_without_rewrite_argv() -> None:
    """The cli_flags fixture without its ``rewrite-argv=yes`` switch: nothing changes, every argv list is listed;
    the parser's own definition is not SGLang's, so it is only listed as not tied (``-v``), never advised."""
    (case,) = [case for case in CASES if case.name == "cli_flags"]
    source = case.source.read_text()
    result = migrate_source(source, case.virtual_path, RULES, load_renames(), RunOptions(rewrite_argv=False))
    assert not result.changed
    found = [str(f) for f in result.findings if f.kind is FindingKind.ARGV]
    assert len(found) == 6 and all("passes legacy flag" in line for line in found)
    assert found[0] == (
        "CG402 7: argument list passes legacy flag(s) --disable-piecewise-cuda-graph, --cuda-graph-bs, "
        "--cuda-graph-max-bs"
    )
    assert [str(f) for f in result.findings if f.kind is FindingKind.SKIP] == [_OWN_DEFINITION]
    assert [f for f in result.findings if f.kind is FindingKind.TODO] == []


_ADVICE = "define the flags with cudagraph.config.add_cli_args"
_NOT_SGLANGS = "this program's own parser, not SGLang's ServerArgs.add_cli_args; left alone"


@pytest.mark.parametrize("rewrite_argv", [False, True], ids=["listing", "rewrite-argv"])
def test_a_flag_definition_is_advised_only_in_sglangs_parser_and_never_marked(rewrite_argv: bool) -> None:
    """A program's own flag definition is not the tool's to change: on either path (the ``ast`` listing, the libcst
    rewrite) a definition in SGLang's parser (an override of ``ServerArgs.add_cli_args``, a parser handed to it,
    through one of SGLang's re-exports) is listed for review with the advice; another parser's (the same function's
    other parser, another class's ``add_cli_args``) is only listed as not tied; never a manual step."""
    (case,) = [case for case in CASES if case.name == "flag_definitions"]
    options = RunOptions(rewrite_argv=rewrite_argv)
    result = migrate_source(case.source.read_text(), case.virtual_path, RULES, load_renames(), options)
    assert [str(f) for f in result.findings if f.kind is FindingKind.ARGV] == [
        f"CG402 13: defines legacy flag --cuda-graph-max-bs: {_ADVICE}",
        f"CG402 19: defines legacy flag --disable-cuda-graph: {_ADVICE}",
    ]
    assert [str(f) for f in result.findings if f.kind is FindingKind.SKIP] == [
        f"CG402 21: defines legacy flag --cuda-graph-bs: {_NOT_SGLANGS}",
        f"CG402 28: defines legacy flag --cuda-graph-max-bs: {_NOT_SGLANGS}",
    ]
    assert [f for f in result.findings if f.kind is FindingKind.TODO] == []
    assert TODO_MARKER not in result.migrated.decode() and not result.changed


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_every_manual_step_is_marked_in_the_file(case: FixtureCase) -> None:
    """The report's contract: each "needs a manual step" finding has its TODO comment in the migrated text, whichever
    path the rule took (without ``--rewrite-argv`` too, where CG402 reports from the ``ast`` tree)."""
    for rewrite_argv in sorted({case.options.get("rewrite-argv") == "yes", False}):
        result = case.migrate(case.source.read_text(), rewrite_argv=rewrite_argv)
        comments = " ".join(todo_comments_in(result.migrated.decode()))
        unmarked = [
            str(finding)
            for finding in result.findings
            if finding.kind is FindingKind.TODO and " ".join(finding.message.split()) not in comments
        ]
        assert unmarked == []


def test_every_guide_section_a_todo_points_to_exists() -> None:
    from pathlib import Path

    from cudagraph.migrate.todo_comments import GuideSection

    guide = (Path(__file__).resolve().parents[2] / "refactor" / "migration-guide.md").read_text()
    anchors = {
        "-".join(line.lstrip("#").strip().lower().replace("`", "").replace("'", "").split())
        for line in guide.splitlines()
        if line.startswith("#")
    }
    assert {section.value for section in GuideSection} <= anchors
