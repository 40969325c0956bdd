"""Precedence (JSON > per-phase flags > legacy flags > defaults), override warnings, and same-rank conflicts."""

from __future__ import annotations

import shlex

import pytest
from config_helpers import recorded_warnings, resolve_argv

from cudagraph.config import Backend, ConfigError, LegacyFlagWarning, OverriddenSettingWarning, Phase, resolve

MODE = "--cuda-graph-mode"


def overrides(caught: list) -> list[str]:
    return [str(w.message) for w in caught if w.category is OverriddenSettingWarning]


def test_json_beats_per_phase_flag_and_warns_naming_both() -> None:
    with recorded_warnings() as caught:
        config = resolve_argv([MODE, '{"decode": "breakable"}', "--decode-cuda-graph-backend", "tc_piecewise"])
    assert config.decode.backend is Backend.BREAKABLE
    assert config.sources["decode.backend"] == "json --cuda-graph-mode"
    assert overrides(caught) == [
        "decode.backend: --cuda-graph-mode 'breakable' overrides --decode-cuda-graph-backend 'tc_piecewise'"
    ]


def test_json_beats_per_phase_disable() -> None:
    with recorded_warnings() as caught:
        config = resolve_argv([MODE, '{"prefill": "tc_piecewise"}', "--prefill-disable-cuda-graph"])
    assert config.prefill.backend is Backend.TC_PIECEWISE
    assert overrides(caught) == [
        "prefill.backend: --cuda-graph-mode 'tc_piecewise' overrides --prefill-disable-cuda-graph 'disabled'"
    ]


def test_per_phase_flag_beats_legacy_flag() -> None:
    with recorded_warnings() as caught:
        config = resolve_argv(["--prefill-cuda-graph-backend", "tc_piecewise", "--disable-piecewise-cuda-graph"])
    assert config.prefill.backend is Backend.TC_PIECEWISE
    assert overrides(caught) == [
        "prefill.backend: --prefill-cuda-graph-backend 'tc_piecewise' overrides "
        "--disable-piecewise-cuda-graph 'disabled'"
    ]
    assert [w.category for w in caught].count(LegacyFlagWarning) == 1


def test_one_warning_names_every_overridden_source() -> None:
    with recorded_warnings() as caught:
        config = resolve_argv(
            [MODE, '{"decode": "full"}', "--decode-cuda-graph-backend", "breakable", "--disable-cuda-graph"]
        )
    assert config.decode.backend is Backend.FULL
    assert config.prefill.backend is Backend.DISABLED  # the legacy flag still decides the phase JSON leaves out
    assert overrides(caught) == [
        "decode.backend: --cuda-graph-mode 'full' overrides --decode-cuda-graph-backend 'breakable' and "
        "--disable-cuda-graph 'disabled'"
    ]


def test_modern_bucket_flags_beat_legacy_ones() -> None:
    with recorded_warnings() as caught:
        config = resolve_argv(
            [
                *("--decode-cuda-graph-bs", "1", "2"),
                *("--cuda-graph-bs", "4"),
                *("--prefill-cuda-graph-max-tokens", "32"),
                *("--piecewise-cuda-graph-max-tokens", "64"),
                *("--tc-piecewise-compiler", "eager"),
                *("--piecewise-cuda-graph-compiler", "inductor"),
            ]
        )
    assert config.decode.buckets == (1, 2) and config.prefill.buckets == (16, 32)
    assert config.tc_piecewise_compiler == "eager"
    assert overrides(caught) == [
        "decode.buckets: --decode-cuda-graph-bs [1, 2] overrides --cuda-graph-bs [4]",
        "prefill.max_size: --prefill-cuda-graph-max-tokens 32 overrides --piecewise-cuda-graph-max-tokens 64",
        "tc_piecewise_compiler: --tc-piecewise-compiler 'eager' overrides --piecewise-cuda-graph-compiler 'inductor'",
    ]


def test_agreeing_sources_do_not_warn() -> None:
    with recorded_warnings() as caught:
        config = resolve_argv([MODE, '{"decode": "disabled"}', "--decode-disable-cuda-graph", "--disable-cuda-graph"])
    assert config.decode.backend is Backend.DISABLED and config.prefill.backend is Backend.DISABLED
    assert overrides(caught) == []


def test_flags_of_one_level_that_agree_are_fine() -> None:
    with pytest.warns(LegacyFlagWarning):
        config = resolve_argv(["--disable-cuda-graph", "--disable-piecewise-cuda-graph"])
    assert config.prefill.backend is Backend.DISABLED


SAME_RANK_CONFLICTS = [
    pytest.param(
        "--decode-cuda-graph-backend full --decode-disable-cuda-graph",
        "decode.backend: --decode-cuda-graph-backend gives 'full'",
        "--decode-disable-cuda-graph gives 'disabled'",
        id="per-phase",
    ),
    pytest.param(
        "--enable-breakable-cuda-graph --enforce-piecewise-cuda-graph",
        "prefill.backend: --enable-breakable-cuda-graph gives 'breakable'",
        "--enforce-piecewise-cuda-graph gives 'tc_piecewise'",
        id="legacy",
    ),
    pytest.param(
        "--disable-cuda-graph --enable-breakable-cuda-graph",
        "prefill.backend: --disable-cuda-graph gives 'disabled'",
        "--enable-breakable-cuda-graph gives 'breakable'",
        id="legacy-disable",
    ),
    # SGLang's merged spellings rank with the per-phase flag they spell
    pytest.param(
        "--decode-cuda-graph-backend full --cuda-graph-backend-decode breakable",
        "decode.backend: --decode-cuda-graph-backend gives 'full'",
        "--cuda-graph-backend-decode gives 'breakable'",
        id="sglang-backend",
    ),
    pytest.param(
        "--cuda-graph-backend-prefill tc_piecewise --disable-prefill-cuda-graph",
        "prefill.backend: --cuda-graph-backend-prefill gives 'tc_piecewise'",
        "--disable-prefill-cuda-graph gives 'disabled'",
        id="sglang-disable",
    ),
    pytest.param(
        """--cuda-graph-mode '{"decode": "full"}' --cuda-graph-config '{"decode": "disabled"}'""",
        "decode.backend: --cuda-graph-mode gives 'full'",
        "--cuda-graph-config gives 'disabled'",
        id="sglang-json",
    ),
    pytest.param(
        "--cuda-graph-bs-prefill 16 --prefill-cuda-graph-tokens 32",
        "prefill.buckets: --prefill-cuda-graph-tokens gives [32]",
        "--cuda-graph-bs-prefill gives [16]",
        id="sglang-buckets",
    ),
    pytest.param(
        "--cuda-graph-tc-compiler inductor --tc-piecewise-compiler eager",
        "tc_piecewise_compiler: --tc-piecewise-compiler gives 'eager'",
        "--cuda-graph-tc-compiler gives 'inductor'",
        id="sglang-compiler",
    ),
    # vLLM's spellings rank with the flags whose meaning they carry
    pytest.param(
        "--cudagraph-mode PIECEWISE --decode-cuda-graph-backend breakable",
        "decode.backend: --decode-cuda-graph-backend gives 'breakable'",
        "--cudagraph-mode gives 'tc_piecewise'",
        id="vllm-mode",
    ),
    pytest.param(
        "--enforce-eager --cuda-graph-backend-prefill tc_piecewise",
        "prefill.backend: --cuda-graph-backend-prefill gives 'tc_piecewise'",
        "--enforce-eager gives 'disabled'",
        id="vllm-enforce-eager",
    ),
    pytest.param(
        """--cudagraph-mode FULL_DECODE_ONLY --compilation-config '{"cudagraph_mode": "NONE"}'""",
        "decode.backend: --cudagraph-mode gives 'full'",
        "--compilation-config gives 'disabled'",
        id="vllm-compilation-config",
    ),
    pytest.param(
        """--compilation-config '{"cudagraph_capture_sizes": [1, 2]}' --decode-cuda-graph-bs 4""",
        "decode.buckets: --decode-cuda-graph-bs gives [4]",
        "--compilation-config gives [1, 2]",
        id="vllm-capture-sizes-json",
    ),
    pytest.param(
        "--cudagraph-capture-sizes 8 --cuda-graph-bs-decode 16",
        "decode.buckets: --cuda-graph-bs-decode gives [16]",
        "--cudagraph-capture-sizes gives [8]",
        id="vllm-capture-sizes",
    ),
]
"""Flags of one precedence rank that disagree, whichever spelling (ours, SGLang's, vLLM's) each uses (a command line),
and what the error says each gives."""


@pytest.mark.parametrize(("command_line", "first", "second"), SAME_RANK_CONFLICTS)
def test_same_rank_disagreement_is_an_error(command_line: str, first: str, second: str) -> None:
    with recorded_warnings() as caught, pytest.raises(ConfigError) as error:
        resolve_argv(shlex.split(command_line))
    assert str(error.value) == f"{first} but {second}; both have the same precedence, so give only one"
    assert caught == []  # a failed resolution warns about nothing


def test_per_phase_json_leaves_other_phase_to_flags() -> None:
    config = resolve_argv([MODE, '{"decode": "breakable"}', "--prefill-cuda-graph-backend", "tc_piecewise"])
    assert config.backend(Phase.DECODE) is Backend.BREAKABLE and config.backend(Phase.PREFILL) is Backend.TC_PIECEWISE
    assert config.sources["prefill.backend"] == "flag --prefill-cuda-graph-backend"


def test_empty_json_object_changes_nothing() -> None:
    assert resolve_argv([MODE, "{}"]) == resolve()


def test_json_mapping_from_python() -> None:
    config = resolve(cuda_graph_mode={Phase.DECODE: Backend.DISABLED, "prefill": "tc_piecewise"})
    assert config == resolve_argv([MODE, '{"decode": "disabled", "prefill": "tc_piecewise"}'])


def test_explicit_buckets_and_max() -> None:
    config = resolve(decode_cuda_graph_bs=[4, 2], decode_cuda_graph_max_bs=64)
    assert (config.decode.buckets, config.decode.max_size) == ((2, 4, 64), 64)  # the max is always captured
    assert config.sources["decode.max_size"] == "flag --decode-cuda-graph-max-bs"
    assert config.sources["decode.buckets"] == (
        "flag --decode-cuda-graph-bs (max 64 from --decode-cuda-graph-max-bs appended as the last bucket)"
    )
    reaching = resolve(decode_cuda_graph_bs=[4, 2, 64], decode_cuda_graph_max_bs=64)
    assert reaching == config and reaching.sources["decode.buckets"] == "flag --decode-cuda-graph-bs"
    only_buckets = resolve(decode_cuda_graph_bs=[4, 2])
    assert only_buckets.decode.max_size == 4
    assert only_buckets.sources["decode.max_size"] == "derived from the largest of decode.buckets"


def test_explicit_buckets_may_exceed_the_default_max() -> None:
    assert resolve(decode_cuda_graph_bs=[512]).decode.buckets == (512,)


def test_disabled_phase_has_no_buckets_even_when_given() -> None:
    config = resolve(prefill_disable_cuda_graph=True, prefill_cuda_graph_tokens=[64], prefill_cuda_graph_max_tokens=64)
    assert (config.prefill.buckets, config.prefill.max_size, config.prefill.enabled) == ((), 0, False)
    assert config.sources["prefill.buckets"] == "derived from prefill.backend disabled"


def test_false_switch_keywords_mean_not_given() -> None:
    with recorded_warnings() as caught:
        config = resolve(disable_cuda_graph=False, debug_cuda_graph=False, decode_cuda_graph_bs=None)
    assert config == resolve() and caught == []
