"""Hand-offs, patches, import fallbacks and member strings: the construction contract read off SGLang's signatures,
and what each fixture of these reports (its TODOs, by the members and contracts they name)."""

from __future__ import annotations

import re

import pytest

from cudagraph.migrate.handoffs import construction_contract
from cudagraph.migrate.legacy_api import load_legacy_api
from cudagraph.migrate.renames import load_renames
from cudagraph.migrate.rules.base import FindingKind

from .fixture_cases import discover_cases
from .test_fixtures import HANDOFF_FIXTURES

CASES = {case.name: case for case in discover_cases() if case.name in HANDOFF_FIXTURES and case.switch is None}
RUNNER_MODULE = "sglang.srt.model_executor.cuda_graph_runner"


def _todos(name: str) -> list[str]:
    case = CASES[name]
    return [f.message for f in case.migrate(case.source.read_text()).findings if f.kind is FindingKind.TODO]


@pytest.mark.parametrize(
    ("legacy", "spelled"),
    [
        (f"{RUNNER_MODULE}.CudaGraphRunner", "CudaGraphRunner(model_runner)"),
        (
            "sglang.srt.speculative.eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner",
            "EAGLEDraftCudaGraphRunner(eagle_worker)",
        ),
        (f"{RUNNER_MODULE}.get_batch_sizes_to_capture", "get_batch_sizes_to_capture(model_runner)"),
    ],
)
def test_the_contract_is_the_legacy_signature_s_required_parameters(legacy: str, spelled: str) -> None:
    contract = construction_contract(load_legacy_api(), legacy)
    assert contract is not None and contract.spelled() == spelled


def test_a_name_the_legacy_data_does_not_know_has_no_contract() -> None:
    assert construction_contract(load_legacy_api(), "pymllm.executor.cuda_graph_runner.CudaGraphRunner") is None


def test_the_eagle_draft_runners_have_rows_and_their_legacy_signatures() -> None:
    table = load_renames()
    legacy = load_legacy_api()
    for module, name, new in (
        ("sglang.srt.speculative.eagle_draft_cuda_graph_runner", "EAGLEDraftCudaGraphRunner", "DraftCudaGraphRunner"),
        (
            "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner",
            "EAGLEDraftExtendCudaGraphRunner",
            "DraftExtendCudaGraphRunner",
        ),
    ):
        row = table.symbol(module, name)
        assert row is not None and row.new == f"cudagraph.runner.{new}"
        legacy_class = legacy.classes[f"{module}.{name}"]
        # every hook the row explains is a method the legacy class has (a typo would explain nothing)
        assert row.hooks and {hook for hook, _ in row.hooks} <= set(legacy_class.methods)


def test_every_hand_off_that_breaks_the_contract_names_it_and_what_the_new_class_also_needs() -> None:
    todos = _todos("handoff_values")
    handed_on = [todo for todo in todos if "is handed on here" in todo]
    # the dict, the return, the default and the argument; the isinstance test is not a hand-off
    assert sum("CudaGraphRunner(model_runner): DecodeCudaGraphRunner also needs config" in t for t in handed_on) == 4
    assert any("get_batch_sizes_to_capture(model_runner)" in todo and "'config'" in todo for todo in handed_on)
    assert not any("ShimRunner" in todo or "freeze_gc" in todo for todo in todos)


def test_a_patched_class_names_what_each_patched_member_became() -> None:
    todos = _todos("patched_classes")
    assert any("replay -> DecodeCudaGraphRunner.replay" in todo for todo in todos)
    assert any("warmup_torch_compile -> no counterpart on PrefillCudaGraphRunner" in todo for todo in todos)
    assert all("_original_replay" not in todo for todo in todos)  # a read of a member the new class has is fine


def test_a_fallback_moves_under_the_name_every_branch_binds() -> None:
    migrated = CASES["import_fallbacks"].expected
    assert "    from cudagraph.runner import DecodeCudaGraphRunner as CudaGraphRunner\n" in migrated
    assert "decode = CudaGraphRunner(model_runner, config)" in migrated
    assert _todos("import_fallbacks") == []
    patched = _todos("import_fallback_patched")
    assert any("patched" in todo and "capture -> DecodeCudaGraphRunner.capture" in todo for todo in patched)


def test_member_strings_name_the_members_they_reach_and_those_the_new_class_lacks() -> None:
    todos = _todos("dotted_member_strings")
    prefix = [todo for todo in todos if "_capture_graph" in todo]
    assert len(prefix) == 1 and "DecodeCudaGraphRunner has no _capture_graph, _create_device_graph" in prefix[0]
    assert any(
        todo.endswith(
            "CudaGraphRunner.replay reaches CudaGraphRunner's replay, a hook or patch target on the engine's own "
            "runner class (now DecodeCudaGraphRunner): not rewritten; the hook registered here reads the runner's "
            "device, device_module; DecodeCudaGraphRunner has no device_module"
        )
        for todo in todos
    )
    assert any("fetches CudaGraphRunner from it by name" in todo for todo in todos)
    migrated = CASES["dotted_member_strings"].expected
    assert 'GC_HOOK = "cudagraph.backend_utils.freeze_gc"' in migrated
    assert 'importlib.import_module("cudagraph.runner")' in migrated


def test_the_eagle_draft_runners_stay_with_a_todo_at_each_use() -> None:
    todos = _todos("eagle_draft_runners")
    assert any("EAGLEDraftExtendCudaGraphRunner(eagle_worker)" in todo for todo in todos)
    assert any("missing required arguments 'config', 'num_steps'" in todo for todo in todos)
    assert any("'config', 'query_len'" in todo for todo in todos)
    assert any("_create_graph overrides a hook" in todo and "backend=" in todo for todo in todos)


def test_an_eagle_fork_s_refused_subclasses_say_what_the_new_draft_runners_do_instead() -> None:
    todos = _todos("eagle_fork_draft_runners")
    by_class = {
        "capture_one_batch_size overrides DraftCudaGraphRunner.capture_bucket, which it would break": "forward",
        "_postprocess_output_to_raw_bs overrides a hook": "no padded output is left to cut",
        "super().__init__(...): DraftCudaGraphRunner(model_runner, config, *, num_steps": "'config', 'num_steps'",
        "replay overrides DraftExtendCudaGraphRunner.replay, whose contract changed": "DraftSeed(tokens [B]",
    }
    for found, advice in by_class.items():
        assert any(found in todo and advice in todo for todo in todos), found
    # every use of both names stays on SGLang's (nothing half-moved); the retired module's runner moves
    code = [line for line in CASES["eagle_fork_draft_runners"].expected.splitlines() if "#" not in line]
    names = {name for line in code for name in re.findall(r"\w+", line)}
    assert "EAGLEDraftCudaGraphRunner" in names and not names & {"DraftCudaGraphRunner", "DraftExtendCudaGraphRunner"}


def test_an_eagle_fork_s_accepted_subclasses_move_onto_the_draft_runners() -> None:
    (case,) = [case for case in discover_cases() if case.name == "eagle_fork_draft_runners_move"]
    result = case.migrate(case.source.read_text())
    migrated = result.migrated.decode()
    assert [f for f in result.findings if f.kind is FindingKind.TODO] == []
    assert "from cudagraph.runner import DraftCudaGraphRunner, DraftExtendCudaGraphRunner\n" in migrated
    assert "class BoundedDraftRunner(DraftCudaGraphRunner):" in migrated
    assert "class CountingDraftExtendRunner(DraftExtendCudaGraphRunner):" in migrated
    assert "sglang" not in migrated.partition('"""\n\n')[2]
    # the builders of a subclass with no __init__ of its own are out of the file's sight: listed for review
    review = [f.message for f in result.findings if f.kind is FindingKind.MAYBE]
    assert len(review) == 2
    assert "BoundedDraftRunner(eagle_worker), must now pass what DraftCudaGraphRunner(model_runner, config" in review[0]
    assert "CountingDraftExtendRunner(eagle_worker)" in review[1] and "query_len" in review[1]


def test_a_file_on_sglang_s_current_api_keeps_the_draft_runners_and_lists_them_as_not_tied() -> None:
    (case,) = [case for case in discover_cases() if case.name == "eagle_draft_runners_current"]
    result = case.migrate(case.source.read_text())
    assert not result.changed
    skips = [f.message for f in result.findings if f.kind is FindingKind.SKIP]
    assert [skip.partition(":")[0] for skip in skips] == [
        "sglang.srt.speculative.eagle_draft_cuda_graph_runner",
        "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner",
    ]
