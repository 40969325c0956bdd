"""SGLang's merged flag names: first-class spellings of the per-phase flags, at their precedence, named by --explain."""

from __future__ import annotations

import pytest
from config_helpers import help_text, parse, recorded_warnings, resolve_argv

from cudagraph.config import ALIAS_FLAGS, MODERN_FLAGS, Backend, ConfigError, Environment, resolve

SGLANG_FLAGS = {
    "--cuda-graph-config": "--cuda-graph-mode",
    "--cuda-graph-backend-decode": "--decode-cuda-graph-backend",
    "--cuda-graph-backend-prefill": "--prefill-cuda-graph-backend",
    "--disable-decode-cuda-graph": "--decode-disable-cuda-graph",
    "--disable-prefill-cuda-graph": "--prefill-disable-cuda-graph",
    "--cuda-graph-bs-decode": "--decode-cuda-graph-bs",
    "--cuda-graph-bs-prefill": "--prefill-cuda-graph-tokens",
    "--cuda-graph-max-bs-decode": "--decode-cuda-graph-max-bs",
    "--cuda-graph-max-bs-prefill": "--prefill-cuda-graph-max-tokens",
    "--cuda-graph-tc-compiler": "--tc-piecewise-compiler",
}

# (the SGLang spelling with its values, the same as keywords)
CASES = [
    (["--cuda-graph-config", '{"prefill": "tc_piecewise"}'], {"cuda_graph_config": '{"prefill": "tc_piecewise"}'}),
    (["--cuda-graph-backend-decode", "breakable"], {"cuda_graph_backend_decode": "breakable"}),
    (["--cuda-graph-backend-prefill", "disabled"], {"cuda_graph_backend_prefill": "disabled"}),
    (["--disable-decode-cuda-graph"], {"disable_decode_cuda_graph": True}),
    (["--disable-prefill-cuda-graph"], {"disable_prefill_cuda_graph": True}),
    (["--cuda-graph-bs-decode", "1,2", "8"], {"cuda_graph_bs_decode": [1, 2, 8]}),
    (["--cuda-graph-bs-prefill", "64", "16"], {"cuda_graph_bs_prefill": "16,64"}),
    (["--cuda-graph-max-bs-decode", "24"], {"cuda_graph_max_bs_decode": 24}),
    (["--cuda-graph-max-bs-prefill", "512"], {"cuda_graph_max_bs_prefill": 512}),
    (["--cuda-graph-tc-compiler", "inductor"], {"cuda_graph_tc_compiler": "inductor"}),
]


def canonical_argv(argv: list[str]) -> list[str]:
    return [SGLANG_FLAGS.get(token, token) for token in argv]


def test_the_alias_table_is_the_design_cards_sglang_list() -> None:
    sglang = {alias.option: alias.canonical for alias in ALIAS_FLAGS if alias.engine == "SGLang"}
    assert sglang == SGLANG_FLAGS
    assert all(alias.canonical in MODERN_FLAGS for alias in ALIAS_FLAGS)
    assert {argv[0] for argv, _ in CASES} == set(SGLANG_FLAGS)


@pytest.mark.parametrize(("argv", "keywords"), CASES, ids=lambda value: value[0] if isinstance(value, list) else "")
def test_each_sglang_spelling_resolves_like_its_flag_and_is_named_by_explain(
    argv: list[str], keywords: dict[str, object], no_warnings: object
) -> None:
    expected = resolve_argv(canonical_argv(argv))
    config = resolve_argv(argv)
    assert config == expected == resolve(**keywords)
    assert config != resolve()
    renamed = {key: source.replace(argv[0], SGLANG_FLAGS[argv[0]]) for key, source in config.sources.items()}
    assert renamed == dict(expected.sources)
    assert any(source.endswith(argv[0]) for source in config.sources.values())  # the spelling the user typed
    assert argv[0] in config.explain()


def test_help_lists_each_spelling_with_its_flag() -> None:
    text = help_text()
    assert "--cuda-graph-backend-decode {full,breakable,tc_piecewise,disabled} SGLang's spelling of " in text
    assert "--disable-prefill-cuda-graph SGLang's spelling of --prefill-disable-cuda-graph" in text


def test_sglang_json_locks_its_phases_like_cuda_graph_mode() -> None:
    config = resolve_argv(["--cuda-graph-config", '{"prefill": "breakable"}'], environment=Environment(lora=True))
    assert config.prefill.backend is Backend.BREAKABLE
    assert config.sources["prefill.backend"] == "json --cuda-graph-config"


def test_sglang_json_outranks_per_phase_flags() -> None:
    with recorded_warnings() as caught:
        config = resolve_argv(["--cuda-graph-config", '{"decode": "breakable"}', "--cuda-graph-backend-decode", "full"])
    assert config.decode.backend is Backend.BREAKABLE
    assert [str(w.message) for w in caught] == [
        "decode.backend: --cuda-graph-config 'breakable' overrides --cuda-graph-backend-decode 'full'"
    ]


def test_sglang_spelling_outranks_legacy_flags() -> None:
    with recorded_warnings() as caught:
        config = resolve_argv(["--cuda-graph-max-bs-decode", "16", "--cuda-graph-max-bs", "32"])
    assert config.decode.max_size == 16
    assert "decode.max_size: --cuda-graph-max-bs-decode 16 overrides --cuda-graph-max-bs 32" in [
        str(w.message) for w in caught
    ]


def test_agreeing_with_the_flag_it_spells_is_fine(no_warnings: object) -> None:
    config = resolve_argv(
        [
            *("--cuda-graph-bs-decode", "1,2,4", "--decode-cuda-graph-bs", "4", "2", "1"),
            *("--cuda-graph-backend-decode", "breakable", "--decode-cuda-graph-backend", "breakable"),
            *("--disable-prefill-cuda-graph", "--prefill-disable-cuda-graph"),
        ]
    )
    assert (config.decode.backend, config.decode.buckets) == (Backend.BREAKABLE, (1, 2, 4))
    assert config.prefill.backend is Backend.DISABLED
    assert config.sources["decode.buckets"] == "flag --decode-cuda-graph-bs"  # the modern spelling, when both agree


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        (
            {"cuda_graph_backend_prefill": "piecewise"},
            "--cuda-graph-backend-prefill: unknown backend 'piecewise' for prefill; "
            "allowed backends: full, breakable, tc_piecewise, disabled",
        ),
        (
            {"cuda_graph_max_bs_decode": "many"},
            "--cuda-graph-max-bs-decode: 'many' is not an integer; allowed: positive integers",
        ),
        (
            {"cuda_graph_config": "{decode}"},
            "--cuda-graph-config: malformed JSON '{decode}' (Expecting property name enclosed in double quotes at "
            'char 1); expected an object like {"decode": "full", "prefill": "breakable"}',
        ),
        ({"disable_decode_cuda_graph": "yes"}, "--disable-decode-cuda-graph: expected True or False, got 'yes'"),
    ],
)
def test_errors_name_the_spelling_the_user_typed(keywords: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        resolve(**keywords)
    assert str(error.value) == message


def test_profile_capture_switch() -> None:
    config = resolve_argv(["--enable-profile-cuda-graph"])
    assert config.profile_capture is True and resolve().profile_capture is False
    assert config.sources["profile_capture"] == "flag --enable-profile-cuda-graph"
    assert config.to_dict()["profile_capture"] is True
    assert "--enable-profile-cuda-graph" in config.to_cli_args()
    assert resolve(parse(config.to_cli_args())) == config == resolve(enable_profile_cuda_graph=True)
