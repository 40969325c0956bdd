"""Every flag: registered in one argparse group, parsed raw, and resolved to the setting it names."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from config_helpers import help_text, parse, recorded_warnings, resolve_argv

from cudagraph.config import (
    ALIAS_FLAGS,
    LEGACY_FLAGS,
    MODERN_FLAGS,
    SGLANG_FLAGS,
    VLLM_FLAGS,
    Backend,
    ConfigError,
    CudaGraphConfig,
    Environment,
    LegacyFlagWarning,
    MemoryBudget,
    Phase,
    add_cli_args,
    default_buckets,
    resolve,
)

tomllib = pytest.importorskip(
    "tomllib" if sys.version_info >= (3, 11) else "tomli",
    reason="reading refactor/renames.toml on Python 3.10 needs tomli: pip install tomli (cudagraph-config requires it)",
)

ROOT = Path(__file__).resolve().parents[2]
ALL_OPTIONS = [
    *MODERN_FLAGS,
    *(flag.option for flag in (*ALIAS_FLAGS, *SGLANG_FLAGS, *VLLM_FLAGS, *LEGACY_FLAGS)),
]

ISSUE_FLAGS = {
    "--cuda-graph-mode",
    "--decode-cuda-graph-backend",
    "--prefill-cuda-graph-backend",
    "--decode-disable-cuda-graph",
    "--prefill-disable-cuda-graph",
    "--decode-cuda-graph-bs",
    "--decode-cuda-graph-max-bs",
    "--prefill-cuda-graph-tokens",
    "--prefill-cuda-graph-max-tokens",
    "--decode-cuda-graph-max-padding-ratio",
    "--prefill-cuda-graph-max-padding-ratio",
    "--decode-cuda-graph-memory-budget",
    "--prefill-cuda-graph-memory-budget",
    "--decode-cuda-graph-capture-policy",
    "--prefill-cuda-graph-capture-policy",
    "--tc-piecewise-compiler",
    "--tc-piecewise-compile-cache-dir",
    "--torch-compile-max-bs",
    "--torch-compile-mode",
    "--debug-cuda-graph",
    "--enable-cudagraph-gc",
    "--disable-cuda-graph-padding",
    "--enable-profile-cuda-graph",
}
ISSUE_LEGACY_FLAGS = {
    "--disable-cuda-graph",
    "--disable-piecewise-cuda-graph",
    "--enable-breakable-cuda-graph",
    "--enforce-piecewise-cuda-graph",
    "--cuda-graph-bs",
    "--cuda-graph-max-bs",
    "--piecewise-cuda-graph-tokens",
    "--piecewise-cuda-graph-max-tokens",
    "--piecewise-cuda-graph-compiler",
}


def test_flag_set_is_exactly_the_issues() -> None:
    assert set(MODERN_FLAGS) == ISSUE_FLAGS
    assert {flag.option for flag in LEGACY_FLAGS} == ISSUE_LEGACY_FLAGS


def test_all_flags_in_one_group() -> None:
    parser = argparse.ArgumentParser()
    group = add_cli_args(parser)
    options = {option for action in group._group_actions for option in action.option_strings}
    assert options == set(ALL_OPTIONS)
    other_groups = [g for g in parser._action_groups if g is not group]
    assert not any(set(a.option_strings) & set(ALL_OPTIONS) for g in other_groups for a in g._group_actions)


def test_unset_flags_are_none() -> None:
    namespace = parse([])
    assert all(getattr(namespace, action) is None for action in vars(namespace))


def test_help_lists_legacy_replacements() -> None:
    text = help_text()
    assert "deprecated alias of --decode-disable-cuda-graph --prefill-disable-cuda-graph" in text
    assert "deprecated alias of --prefill-cuda-graph-backend breakable" in text


def test_no_flags_gives_defaults(no_warnings: object) -> None:
    config = resolve_argv([])
    assert config == resolve()
    assert config.backend(Phase.DECODE) is Backend.FULL and config.backend(Phase.PREFILL) is Backend.BREAKABLE
    assert config.decode.buckets == default_buckets(Phase.DECODE, 256) and config.decode.max_size == 256
    assert config.prefill.buckets == default_buckets(Phase.PREFILL, 2048) and config.prefill.max_size == 2048
    assert (config.tc_piecewise_compiler, config.debug, config.enable_gc, config.disable_padding) == (
        "eager",
        False,
        False,
        False,
    )
    assert config.profile_capture is False
    assert set(config.sources.values()) == {
        "default",
        "default schedule up to decode.max_size",
        "default schedule up to prefill.max_size",
    }


@pytest.mark.parametrize(
    ("argv", "check"),
    [
        (["--cuda-graph-mode", '{"decode": "breakable"}'], lambda c: c.decode.backend is Backend.BREAKABLE),
        (["--decode-cuda-graph-backend", "tc_piecewise"], lambda c: c.decode.backend is Backend.TC_PIECEWISE),
        (["--prefill-cuda-graph-backend", "tc_piecewise"], lambda c: c.prefill.backend is Backend.TC_PIECEWISE),
        (["--decode-disable-cuda-graph"], lambda c: c.decode == c.decode.__class__(Backend.DISABLED, (), 0)),
        (["--prefill-disable-cuda-graph"], lambda c: c.prefill == c.prefill.__class__(Backend.DISABLED, (), 0)),
        (["--decode-cuda-graph-bs", "16", "2", "2"], lambda c: (c.decode.buckets, c.decode.max_size) == ((2, 16), 16)),
        (["--decode-cuda-graph-max-bs", "20"], lambda c: c.decode.buckets == (1, 2, 4, 8, 16, 20)),
        (["--prefill-cuda-graph-tokens", "64", "8"], lambda c: c.prefill.buckets == (8, 64)),
        (["--prefill-cuda-graph-max-tokens", "40"], lambda c: c.prefill.buckets == (16, 32, 40)),
        (["--decode-cuda-graph-max-padding-ratio", "1.5"], lambda c: c.decode.max_padding_ratio == 1.5),
        (["--prefill-cuda-graph-max-padding-ratio", "4"], lambda c: c.prefill.max_padding_ratio == 4.0),
        (["--decode-cuda-graph-memory-budget", "2"], lambda c: c.decode.memory_budget == MemoryBudget(bytes=2**31)),
        (
            ["--prefill-cuda-graph-memory-budget", "20%"],
            lambda c: c.prefill.memory_budget == MemoryBudget(free_fraction=0.2),
        ),
        (["--tc-piecewise-compiler", "inductor"], lambda c: c.tc_piecewise_compiler == "inductor"),
        (["--tc-piecewise-compile-cache-dir", "/cache"], lambda c: c.compile_cache_dir == "/cache"),
        (["--torch-compile-max-bs", "8"], lambda c: c.torch_compile_max_bs == 8),
        (
            ["--torch-compile-mode", "max-autotune-no-cudagraphs"],
            lambda c: c.torch_compile_mode == "max-autotune-no-cudagraphs",
        ),
        (["--debug-cuda-graph"], lambda c: c.debug),
        (["--enable-cudagraph-gc"], lambda c: c.enable_gc),
        (["--disable-cuda-graph-padding"], lambda c: c.disable_padding),
        (["--enable-profile-cuda-graph"], lambda c: c.profile_capture),
    ],
    ids=lambda value: value[0] if isinstance(value, list) else "",
)
def test_each_modern_flag(argv: list[str], check: Callable[[CudaGraphConfig], bool], no_warnings: object) -> None:
    config = resolve_argv(argv)
    assert check(config)
    assert config != resolve()
    assert any(argv[0] in source for source in config.sources.values())


LEGACY_EQUIVALENTS = [
    (["--disable-cuda-graph"], ["--decode-disable-cuda-graph", "--prefill-disable-cuda-graph"]),
    (["--disable-piecewise-cuda-graph"], ["--prefill-disable-cuda-graph"]),
    (["--enable-breakable-cuda-graph"], ["--prefill-cuda-graph-backend", "breakable"]),
    (["--enforce-piecewise-cuda-graph"], ["--prefill-cuda-graph-backend", "tc_piecewise"]),
    (["--cuda-graph-bs", "3", "1"], ["--decode-cuda-graph-bs", "3", "1"]),
    (["--cuda-graph-max-bs", "24"], ["--decode-cuda-graph-max-bs", "24"]),
    (["--piecewise-cuda-graph-tokens", "100", "10"], ["--prefill-cuda-graph-tokens", "100", "10"]),
    (["--piecewise-cuda-graph-max-tokens", "300"], ["--prefill-cuda-graph-max-tokens", "300"]),
    (["--piecewise-cuda-graph-compiler", "inductor"], ["--tc-piecewise-compiler", "inductor"]),
]


def test_every_legacy_flag_has_an_equivalence_case() -> None:
    assert {legacy[0] for legacy, _ in LEGACY_EQUIVALENTS} == ISSUE_LEGACY_FLAGS


@pytest.mark.parametrize(("legacy", "modern"), LEGACY_EQUIVALENTS, ids=lambda value: value[0])
def test_each_legacy_flag_warns_once_and_resolves_like_its_replacement(legacy: list[str], modern: list[str]) -> None:
    with recorded_warnings() as modern_warnings:
        expected = resolve_argv(modern)
    assert modern_warnings == []
    with recorded_warnings() as caught:
        config = resolve(parse(legacy))
    assert config == expected
    assert f"legacy flag {legacy[0]}" in config.sources.values()  # the flag decided a value
    assert len(caught) == 1
    warning = caught[0]
    assert warning.category is LegacyFlagWarning and issubclass(warning.category, FutureWarning)
    message = str(warning.message)
    assert message.startswith(f"{legacy[0]} (keyword {legacy[0][2:].replace('-', '_')}) is deprecated")
    for option in (token for token in modern if token.startswith("--")):
        assert option in message
    assert "removed in 1.0.0" in message
    assert warning.filename == __file__  # points at the caller of resolve, not inside the package


LEGACY_KEYWORDS = {
    "--disable-cuda-graph": {"disable_cuda_graph": True},
    "--disable-piecewise-cuda-graph": {"disable_piecewise_cuda_graph": True},
    "--enable-breakable-cuda-graph": {"enable_breakable_cuda_graph": True},
    "--enforce-piecewise-cuda-graph": {"enforce_piecewise_cuda_graph": True},
    "--cuda-graph-bs": {"cuda_graph_bs": [3, 1]},
    "--cuda-graph-max-bs": {"cuda_graph_max_bs": 24},
    "--piecewise-cuda-graph-tokens": {"piecewise_cuda_graph_tokens": [100, 10]},
    "--piecewise-cuda-graph-max-tokens": {"piecewise_cuda_graph_max_tokens": 300},
    "--piecewise-cuda-graph-compiler": {"piecewise_cuda_graph_compiler": "inductor"},
}


@pytest.mark.parametrize(("legacy", "modern"), LEGACY_EQUIVALENTS, ids=lambda value: value[0])
def test_legacy_keyword_matches_legacy_flag(legacy: list[str], modern: list[str]) -> None:
    with recorded_warnings() as flag_warnings:
        from_flags = resolve_argv(legacy)
    with recorded_warnings() as keyword_warnings:
        from_keywords = resolve(**LEGACY_KEYWORDS[legacy[0]])
    assert from_keywords == from_flags == resolve_argv(modern)
    assert len(keyword_warnings) == 1
    assert [(w.category, str(w.message)) for w in keyword_warnings] == [
        (w.category, str(w.message)) for w in flag_warnings
    ]


def test_legacy_flag_warns_once_per_call_even_when_repeated() -> None:
    for _ in range(2):
        with recorded_warnings() as caught:
            resolve_argv(["--cuda-graph-bs", "1", "--cuda-graph-bs", "2"])
        assert len(caught) == 1


def test_legacy_table_matches_renames_toml() -> None:
    rows = tomllib.loads((ROOT / "refactor" / "renames.toml").read_text())["rename"]
    flags = {row["old"]: row for row in rows if row["kind"] == "cli_flag"}
    keywords = {row["old"]: row for row in rows if row["kind"] == "kwarg"}
    for flag in LEGACY_FLAGS:
        row = flags[flag.option]
        expected = [(row["new"], row.get("value"))] + [(also, row.get("value")) for also in row.get("also", [])]
        assert list(flag.replacement) == expected, flag.option
        keyword_row = keywords[flag.dest]
        assert [flag.replacement[0][0][2:].replace("-", "_")] == [keyword_row["new"]]
        assert (row["deprecated_in"], row["removed_in"]) == ("0.1.0", "1.0.0")
    assert set(flags) == {flag.option for flag in LEGACY_FLAGS}


def test_engine_style_namespace_with_other_options() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--max-num-reqs", type=int, default=64)
    add_cli_args(parser)
    config = resolve(parser.parse_args(["--model", "m", "--decode-cuda-graph-max-bs", "8"]))
    assert config.decode.buckets == (1, 2, 4, 8)


def test_keywords_replace_namespace_attributes() -> None:
    config = resolve(parse(["--decode-cuda-graph-max-bs", "8"]), decode_cuda_graph_max_bs=4, debug_cuda_graph=True)
    assert config.decode.buckets == (1, 2, 4) and config.debug


def test_mapping_namespace_is_read_like_keywords() -> None:
    assert resolve({"decode_cuda_graph_bs": [2, 1]}) == resolve(decode_cuda_graph_bs=[1, 2])


def test_config_is_frozen() -> None:
    config = resolve()
    with pytest.raises(AttributeError):
        config.debug = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.sources["debug"] = "x"  # type: ignore[index]
    assert isinstance(config, CudaGraphConfig)


@pytest.mark.parametrize(
    ("argv", "expected", "source"),
    [
        ([], 0, "default"),
        (["--torch-compile-max-bs", "16"], 16, "flag --torch-compile-max-bs"),
        (["--enable-torch-compile"], 32, "derived from --enable-torch-compile (SGLang's default)"),
        (["--enable-torch-compile", "--torch-compile-max-bs", "4"], 4, "flag --torch-compile-max-bs"),
        (["--decode-disable-cuda-graph", "--torch-compile-max-bs", "4"], 4, "flag --torch-compile-max-bs"),
    ],
)
def test_compiled_small_buckets_flags(argv: list[str], expected: int, source: str, no_warnings: object) -> None:
    config = resolve_argv(argv)
    assert config.torch_compile_max_bs == expected
    assert config.sources["torch_compile_max_bs"] == source
    assert config.to_dict()["torch_compile_max_bs"] == expected


@pytest.mark.parametrize("backend", ["breakable", "tc_piecewise"])
def test_compiled_small_buckets_need_full_decode_graphs(backend: str) -> None:
    with pytest.raises(ConfigError) as raised:
        resolve_argv(["--decode-cuda-graph-backend", backend, "--torch-compile-max-bs", "8"])
    message = str(raised.value)
    assert message.startswith("--torch-compile-max-bs: compiled small batches run inside full decode graphs")
    assert f"decode uses {backend} (from --decode-cuda-graph-backend)" in message


UNUSED_MODE = (
    "flag --torch-compile-mode (unused: nothing compiles with inductor; it applies with --torch-compile-max-bs and "
    "full decode graphs, or --tc-piecewise-compiler inductor and a tc_piecewise phase)"
)


@pytest.mark.parametrize(
    ("argv", "source"),
    [
        (["--torch-compile-max-bs", "8"], "flag --torch-compile-mode"),
        (["--enable-torch-compile"], "flag --torch-compile-mode"),
        (
            ["--prefill-cuda-graph-backend", "tc_piecewise", "--tc-piecewise-compiler", "inductor"],
            "flag --torch-compile-mode",
        ),
        (["--cudagraph-mode", "PIECEWISE", "--cuda-graph-tc-compiler", "inductor"], "flag --torch-compile-mode"),
        ([], UNUSED_MODE),
        (["--decode-disable-cuda-graph", "--torch-compile-max-bs", "8"], UNUSED_MODE),
        (["--prefill-cuda-graph-backend", "tc_piecewise"], UNUSED_MODE),  # eager pieces compile nothing
        (["--tc-piecewise-compiler", "inductor"], UNUSED_MODE),  # no tc_piecewise phase
    ],
)
@pytest.mark.parametrize("mode", ["default", "max-autotune-no-cudagraphs", "lite"])
def test_compile_mode_is_kept_and_marked_unused_when_nothing_compiles(
    argv: list[str], source: str, mode: str, no_warnings: object
) -> None:
    config = resolve_argv([*argv, "--torch-compile-mode", mode])
    assert config.torch_compile_mode == mode
    assert config.sources["torch_compile_mode"] == source
    assert config.to_dict()["torch_compile_mode"] == mode
    explained = next(line for line in config.explain().splitlines() if line.startswith("torch_compile_mode "))
    assert explained.split()[1] == mode and explained.endswith(source)
    # Nothing else changes.
    assert config == CudaGraphConfig(**{**vars(resolve_argv(argv)), "torch_compile_mode": mode})


def test_compile_mode_unused_after_a_rule_turns_the_compiling_phase_off() -> None:
    # The note follows what runs: a rule that turns tc_piecewise prefill off leaves nothing compiling.
    config = resolve(
        prefill_cuda_graph_backend="tc_piecewise",
        tc_piecewise_compiler="inductor",
        torch_compile_mode="lite",
        environment=Environment(lora=True),
    )
    assert config.prefill.backend is Backend.DISABLED and config.torch_compile_mode == "lite"
    assert config.sources["torch_compile_mode"] == UNUSED_MODE


def test_compile_mode_defaults_to_inductors_own() -> None:
    config = resolve()
    assert config.torch_compile_mode is None and config.sources["torch_compile_mode"] == "default"
    assert "--torch-compile-mode" not in config.to_cli_args()
