"""The rename table: complete against the documented new homes, consistent, and loadable without libcst."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cudagraph.migrate.renames import RenameKind, RenameTableError, load_renames, renames_path

TABLE = load_renames()
LEGACY_SHIM_MODULES = (
    "cudagraph.legacy.cuda_graph_runner",
    "cudagraph.legacy.piecewise_context_manager",
    "cudagraph.legacy.breakable_cuda_graph",
    "cudagraph.legacy.server_args",
)
LEGACY_MODULES = (
    "sglang.srt.model_executor.cuda_graph_runner",
    "sglang.srt.model_executor.piecewise_cuda_graph_runner",
    "sglang.srt.model_executor.breakable_cuda_graph_runner",
    "sglang.srt.model_executor.breakable_cuda_graph",
    "sglang.srt.compilation.piecewise_context_manager",
    "pymllm.executor.cuda_graph_runner",
    "sglang.srt.speculative.eagle_draft_cuda_graph_runner",
    "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner",
    *LEGACY_SHIM_MODULES,
)
# The new homes every symbol row must land in (the shared legacy-flags note; kept here as the test's oracle).
NEW_HOMES = {
    "cudagraph.config": {
        "Phase", "Backend", "resolve", "add_cli_args", "CudaGraphConfig", "ConfigError", "default_buckets",
    },
    "cudagraph.backend_utils": {
        "is_capture_mode", "model_capture_mode", "freeze_gc", "get_global_graph_memory_pool",
        "set_global_graph_memory_pool", "is_in_tc_piecewise_cuda_graph", "enable_tc_piecewise_cuda_graph",
        "is_in_torch_compile_warmup", "enable_torch_compile_warmup", "is_in_breakable_cuda_graph", "ForwardContext",
        "set_forward_context", "get_forward_context", "BreakableCUDAGraph", "weak_ref_tensor",
    },
    "cudagraph.backend": {"TC_PIECEWISE_CUDA_GRAPH_CAPTURE_FAILED_MSG"},
    "cudagraph.runner": {
        "DecodeCudaGraphRunner", "PrefillCudaGraphRunner", "get_batch_sizes_to_capture", "ForwardBatch", "ForwardMode",
    },
}  # fmt: skip
UNSHIMMED_HOMES = {"cudagraph.runner": {"DraftCudaGraphRunner", "DraftExtendCudaGraphRunner"}}
"""Homes of names only SGLang's modules had (its EAGLE draft runners): cudagraph never shipped them, so no
``cudagraph.legacy`` shim serves them (a shim would hand out a class that cannot be built as SGLang built it)."""
KWARGS = {
    "disable_cuda_graph": (("decode_disable_cuda_graph", "prefill_disable_cuda_graph"), None),
    "disable_piecewise_cuda_graph": (("prefill_disable_cuda_graph",), None),
    "enable_breakable_cuda_graph": (("prefill_cuda_graph_backend",), "breakable"),
    "enforce_piecewise_cuda_graph": (("prefill_cuda_graph_backend",), "tc_piecewise"),
    "cuda_graph_bs": (("decode_cuda_graph_bs",), None),
    "cuda_graph_max_bs": (("decode_cuda_graph_max_bs",), None),
    "piecewise_cuda_graph_tokens": (("prefill_cuda_graph_tokens",), None),
    "piecewise_cuda_graph_max_tokens": (("prefill_cuda_graph_max_tokens",), None),
    "piecewise_cuda_graph_compiler": (("tc_piecewise_compiler",), None),
}


def test_every_legacy_module_has_a_row() -> None:
    assert set(TABLE.modules) == set(LEGACY_MODULES)


def test_every_symbol_lands_in_its_documented_home() -> None:
    for row in TABLE.of_kind(RenameKind.SYMBOL):
        homes = NEW_HOMES.get(row.new_module, set()) | UNSHIMMED_HOMES.get(row.new_module, set())
        assert row.new_name in homes, row


def test_every_documented_name_is_reachable_from_the_shims() -> None:
    reached = {row.new for module in LEGACY_SHIM_MODULES for row in TABLE.symbols_of(module)}
    documented = {f"{module}.{name}" for module, names in NEW_HOMES.items() for name in names}
    assert documented == reached


def test_issue_renames() -> None:
    expected = {
        ("cudagraph.legacy.cuda_graph_runner", "CudaGraphRunner"): "cudagraph.runner.DecodeCudaGraphRunner",
        ("cudagraph.legacy.cuda_graph_runner", "PiecewiseCudaGraphRunner"): "cudagraph.runner.PrefillCudaGraphRunner",
        ("cudagraph.legacy.cuda_graph_runner", "BreakableCudaGraphRunner"): "cudagraph.runner.PrefillCudaGraphRunner",
        ("cudagraph.legacy.cuda_graph_runner", "get_is_capture_mode"): "cudagraph.backend_utils.is_capture_mode",
        ("cudagraph.legacy.piecewise_context_manager", "is_in_pcg_torch_compile"):
            "cudagraph.backend_utils.is_in_torch_compile_warmup",
        ("cudagraph.legacy.piecewise_context_manager", "enable_piecewise_cuda_graph_compile"):
            "cudagraph.backend_utils.enable_torch_compile_warmup",
        ("sglang.srt.model_executor.piecewise_cuda_graph_runner", "PIECEWISE_CUDA_GRAPH_CAPTURE_FAILED_MSG"):
            "cudagraph.backend.TC_PIECEWISE_CUDA_GRAPH_CAPTURE_FAILED_MSG",
    }  # fmt: skip
    for (module, name), new in expected.items():
        row = TABLE.symbol(module, name)
        assert row is not None and row.new == new
    members = TABLE.by_old(RenameKind.ATTRIBUTE) | TABLE.by_old(RenameKind.METHOD)
    assert {old: row.new for old, row in members.items() if not row.own_name} == {
        "graph_runner": "decode_cuda_graph_runner",
        "piecewise_cuda_graph_runner": "prefill_cuda_graph_runner",
        "init_device_graphs": "init_decode_cuda_graph",
        "init_piecewise_cuda_graphs": "init_prefill_cuda_graph",
        "capture_one_batch_size": "capture_bucket",
    }
    assert {row.old: row.new for row in TABLE.of_kind(RenameKind.CONFIG_STRING)} == {
        "tcpiecewise": "tc_piecewise",
        "tcpcg": "tc_piecewise",
    }
    assert TABLE.by_old(RenameKind.ENUM_MEMBER)["TCPIECEWISE"].new == "TC_PIECEWISE"


@pytest.mark.parametrize("old", sorted(KWARGS))
def test_keywords_and_flags_follow_the_legacy_flag_semantics(old: str) -> None:
    targets, value = KWARGS[old]
    kwarg = TABLE.by_old(RenameKind.KWARG)[old]
    flag = TABLE.by_old(RenameKind.CLI_FLAG)["--" + old.replace("_", "-")]
    assert (kwarg.targets, kwarg.value) == (targets, value)
    assert (flag.targets, flag.value) == (tuple("--" + target.replace("_", "-") for target in targets), value)


def test_every_row_is_deprecated_now_and_removed_at_one() -> None:
    legacy = [row for row in TABLE if not row.own_name]
    assert {(row.deprecated_in, row.removed_in) for row in legacy} == {("0.1.0", "1.0.0")}
    assert all(row.note for row in TABLE)


def test_own_earlier_names_are_the_runners_renamed_methods() -> None:
    """cudagraph-runner 0.2.0 renamed four of its methods: rows of its own classes, with no legacy engine's owner."""
    own = {row.old: row for row in TABLE if row.own_name}
    assert {old: row.new for old, row in own.items()} == {
        "capture_one_shape": "capture_bucket",
        "replay_graph": "replay_bucket",
        "replay_routed": "replay",
        "static_input_tensors": "static_buffer_tensors",
    }
    for row in own.values():
        assert row.kind is RenameKind.METHOD and not row.legacy_owners, row
        assert (row.deprecated_in, row.removed_in) == ("0.2.0", "1.0.0"), row
        assert all(owner.startswith("cudagraph.runner.") for owner in row.owners), row
    assert dict(own["capture_one_shape"].parameters) == dict(own["replay_graph"].parameters) == {"shape": "bucket"}


def test_symbol_rows_split_into_module_and_name() -> None:
    row = TABLE.symbol("cudagraph.legacy.server_args", "resolve")
    assert row is not None
    assert (row.old_module, row.old_name, row.new_module, row.new_name) == (
        "cudagraph.legacy.server_args", "resolve", "cudagraph.config", "resolve",
    )  # fmt: skip
    with pytest.raises(AttributeError, match="only module and symbol rows"):
        _ = TABLE.by_old(RenameKind.KWARG)["cuda_graph_bs"].new_module


def test_the_checkout_table_is_the_one_read() -> None:
    assert renames_path() == Path(__file__).resolve().parents[2] / "refactor" / "renames.toml"


ROW = 'kind = "{kind}"\nold = "{old}"\nnew = "{new}"\ndeprecated_in = "0.1.0"\nremoved_in = "1.0.0"\nnote = "n"\n'


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("schema = 2\n", "schema = 2"),
        ("schema = 1\n[[rename]]\n" + ROW.format(kind="klass", old="a", new="b"), "kind = 'klass'; allowed: module"),
        ('schema = 1\n[[rename]]\nkind = "kwarg"\nold = "a"\n', "missing or non-string field"),
        (
            "schema = 1\n[[rename]]\n" + ROW.format(kind="symbol", old="x.y.Name", new="z.Name"),
            "lives in 'x.y', which has no module row",
        ),
        (
            "schema = 1\n" + ("[[rename]]\n" + ROW.format(kind="cli_flag", old="a", new="b")) * 2,
            "cli_flag 'a' appears twice",
        ),
        ("schema = 1\n[[rename]]\n" + ROW.format(kind="module", old="a b", new="c"), "need dotted Python paths"),
        ("schema = 1\n[[rename]]\n" + ROW.format(kind="kwarg", old="a", new="b") + "colour = 1\n", "unknown field"),
        ("schema = 1\n[[rename]]\n" + ROW.format(kind="kwarg", old="a", new="b"), "kwarg rows need 'owners'"),
        (
            "schema = 1\n[[rename]]\n" + ROW.format(kind="kwarg", old="a", new="b") + 'owners = ["not dotted!"]\n',
            "'owners' must be a list of dotted qualified names",
        ),
        (
            "schema = 1\n[[rename]]\n"
            + ROW.format(kind="kwarg", old="a", new="b")
            + 'owners = ["x.Y"]\nown_name = true\n',
            "'own_name' must be true or false, and only on method rows",
        ),
        (
            "schema = 1\n[[rename]]\n"
            + ROW.format(kind="method", old="a", new="b")
            + 'owners = ["x.Y"]\nlegacy_owners = ["s.Y"]\nown_name = true\n',
            "only on method rows without 'legacy_owners'",
        ),
        (
            "schema = 1\n[[rename]]\n"
            + ROW.format(kind="kwarg", old="a", new="b")
            + 'owners = ["x.Y"]\n[rename.hooks]\nreplay = "returns tokens"\n',
            "'hooks' must be a table of legacy method name = what the new class does instead, and only on symbol rows",
        ),
        (
            "schema = 1\n[[rename]]\n"
            + ROW.format(kind="module", old="x", new="y")
            + "[[rename]]\n"
            + ROW.format(kind="symbol", old="x.A", new="y.B")
            + '[rename.hooks]\n"not a name" = "text"\n',
            "'hooks' must be a table of legacy method name",
        ),
    ],
)
def test_a_malformed_table_is_rejected_with_the_reason(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "renames.toml"
    path.write_text(body)
    with pytest.raises(RenameTableError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_renames(path)


def test_the_loader_imports_neither_libcst_nor_torch() -> None:
    code = textwrap.dedent(
        """
        import sys
        from cudagraph.migrate.renames import load_renames
        table = load_renames()
        assert len(table) > 0
        print(sorted(name for name in ("libcst", "torch", "tqdm") if name in sys.modules))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
