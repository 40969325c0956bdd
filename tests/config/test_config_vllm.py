"""vLLM's spellings: --cudagraph-mode names, --enforce-eager, --compilation-config JSON, cudagraph_capture_sizes."""

from __future__ import annotations

import enum
import json
import logging

import pytest
from config_helpers import recorded_warnings, resolve_argv

from cudagraph.config import (
    ALLOWED_BACKENDS_PER_PHASE,
    VLLM_CUDAGRAPH_MODES,
    Backend,
    ConfigError,
    Environment,
    OverriddenSettingWarning,
    Phase,
    resolve,
)
from cudagraph.config.vllm import COMPILATION_CONFIG_KEYS, VLLM_COMPILATION_CONFIG_FIELDS, allowed_vllm_modes

ALLOWED_MODES = "NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE"

# The design card's table: vLLM name -> (decode, prefill).
DESIGN_TABLE = {
    "NONE": ("disabled", "disabled"),
    "PIECEWISE": ("tc_piecewise", "tc_piecewise"),
    "FULL": ("full", "full"),
    "FULL_DECODE_ONLY": ("full", "disabled"),
    "FULL_AND_PIECEWISE": ("full", "tc_piecewise"),
}
RESOLVABLE = [name for name in DESIGN_TABLE if name in allowed_vllm_modes()]


def test_the_mode_table_is_the_design_cards() -> None:
    assert {
        name: (mode[Phase.DECODE].value, mode[Phase.PREFILL].value) for name, mode in VLLM_CUDAGRAPH_MODES.items()
    } == (DESIGN_TABLE)
    # Every phase allows every backend, so every name of the table resolves.
    assert list(DESIGN_TABLE) == RESOLVABLE


def _per_phase(name: str) -> list[str]:
    decode, prefill = DESIGN_TABLE[name]
    return ["--decode-cuda-graph-backend", decode, "--prefill-cuda-graph-backend", prefill]


@pytest.mark.parametrize("name", RESOLVABLE)
def test_each_mode_name_resolves_like_per_phase_flags(name: str, no_warnings: object) -> None:
    expected = resolve_argv(_per_phase(name))
    for spelling in (name, name.lower(), name.title()):
        config = resolve_argv(["--cudagraph-mode", spelling])
        assert config == expected == resolve(cudagraph_mode=spelling)
        assert config.sources["decode.backend"] == config.sources["prefill.backend"] == "flag --cudagraph-mode"
        assert "flag --cudagraph-mode" in config.explain()


def test_a_vllm_enum_member_is_read_by_its_name() -> None:
    class CUDAGraphMode(enum.Enum):  # the shape of vLLM's enum, whose values are not names
        NONE = 0
        FULL_DECODE_ONLY = (2, 0)

    assert resolve(cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY) == resolve_argv(
        ["--cudagraph-mode", "FULL_DECODE_ONLY"]
    )


def test_full_captures_both_phases_whole(no_warnings: object) -> None:
    config = resolve_argv(["--cudagraph-mode", "FULL"])
    assert (config.decode.backend, config.prefill.backend) == (Backend.FULL, Backend.FULL)
    assert config == resolve_argv(["--cuda-graph-mode", '{"decode": "full", "prefill": "full"}'])
    captures = next(line for line in config.explain().splitlines() if line.startswith("prefill.captures "))
    assert "attention included, one graph per token bucket" in captures


def test_a_mode_a_phase_does_not_allow_is_refused_naming_the_names_that_work(monkeypatch: pytest.MonkeyPatch) -> None:
    # No cell is refused today; the table is still the one place that would refuse one, and the message says so.
    refusing = {**ALLOWED_BACKENDS_PER_PHASE, Phase.PREFILL: frozenset(Backend) - {Backend.FULL}}
    monkeypatch.setattr("cudagraph.config.vllm.ALLOWED_BACKENDS_PER_PHASE", refusing)
    with pytest.raises(ConfigError) as error:
        resolve_argv(["--cudagraph-mode", "FULL"])
    assert str(error.value) == (
        "--cudagraph-mode: FULL sets prefill to 'full', which prefill does not allow "
        "(allowed for prefill: full, breakable, tc_piecewise, disabled); "
        "allowed: NONE, PIECEWISE, FULL_DECODE_ONLY, FULL_AND_PIECEWISE"
    )


def test_enforce_eager_disables_both_phases(no_warnings: object) -> None:
    config = resolve_argv(["--enforce-eager"])
    assert config == resolve_argv(["--decode-disable-cuda-graph", "--prefill-disable-cuda-graph"])
    assert config == resolve(enforce_eager=True) == resolve_argv(["--cudagraph-mode", "none"])
    assert config.sources["decode.backend"] == "flag --enforce-eager"


def test_compilation_config_reads_its_cuda_graph_keys(no_warnings: object) -> None:
    text = json.dumps(
        {
            "cudagraph_mode": "FULL_AND_PIECEWISE",
            "cudagraph_capture_sizes": [8, 1, 2, 4],
            "max_cudagraph_capture_size": 16,
            "level": 3,  # the rest of vLLM's compilation config is vLLM's
            "pass_config": {"enable_fusion": True},
            "compile_sizes": None,
        }
    )
    config = resolve_argv(["--compilation-config", text])
    assert config == resolve_argv(
        [*_per_phase("FULL_AND_PIECEWISE"), "--decode-cuda-graph-bs", "1,2,4,8", "--decode-cuda-graph-max-bs", "16"]
    )
    assert config == resolve(compilation_config=json.loads(text))
    assert config.decode.buckets == (1, 2, 4, 8, 16)  # the largest size is always captured
    for key in ("decode.backend", "prefill.backend", "decode.max_size"):
        assert config.sources[key] == "flag --compilation-config"
    assert config.sources["decode.buckets"] == (
        "flag --compilation-config (max 16 from --compilation-config appended as the last bucket)"
    )


def test_compilation_config_nulls_and_empty_object_say_nothing(no_warnings: object) -> None:
    nulls = {"cudagraph_mode": None, "cudagraph_capture_sizes": None, "max_cudagraph_capture_size": None}
    assert resolve_argv(["--compilation-config", json.dumps(nulls)]) == resolve()
    assert resolve(compilation_config="{}") == resolve()


def test_compilation_config_unknown_keys_are_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="cudagraph.config"):
        resolve(compilation_config={"level": 3, "cudagraph_capture_sizes": [1]})
    assert [record.getMessage() for record in caplog.records] == [
        "--compilation-config: 'level' is not a CUDA-graph setting; left to vLLM"
    ]
    assert caplog.records[0].levelno == logging.DEBUG


@pytest.mark.parametrize(
    ("key", "closest"),
    [("cudagraph_mod", "cudagraph_mode"), ("cudagraph_capture_size", "cudagraph_capture_sizes"), ("levle", "level")],
)
def test_compilation_config_typo_warns_naming_the_closest_key(
    key: str, closest: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="cudagraph.config"):
        config = resolve_argv(["--compilation-config", json.dumps({key: "FULL"})])
    assert config == resolve()  # skipped, as vLLM's own keys are
    assert [(record.name, record.levelno, record.getMessage()) for record in caplog.records] == [
        (
            "cudagraph.config",
            logging.WARNING,
            f"--compilation-config: unknown key {key!r} ignored (neither a CUDA-graph key nor a field of vLLM's "
            f"CompilationConfig); did you mean {closest!r}?",
        )
    ]


def test_compilation_config_key_like_nothing_known_names_the_cuda_graph_keys(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="cudagraph.config"):
        resolve(compilation_config={"zzz": 1})
    assert [record.getMessage() for record in caplog.records] == [
        "--compilation-config: unknown key 'zzz' ignored (neither a CUDA-graph key nor a field of vLLM's "
        "CompilationConfig); the CUDA-graph keys are cudagraph_mode, cudagraph_capture_sizes, "
        "max_cudagraph_capture_size"
    ]


def test_every_known_compilation_config_key_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    known = {key: None for key in VLLM_COMPILATION_CONFIG_FIELDS} | {"cudagraph_mode": "FULL", "level": 3}
    with caplog.at_level(logging.INFO, logger="cudagraph.config"):
        resolve(compilation_config=known)
    assert caplog.records == []
    assert {row.key for row in COMPILATION_CONFIG_KEYS} <= VLLM_COMPILATION_CONFIG_FIELDS


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["--enforce-eager", "--cuda-graph-max-bs", "64"],
            "--cuda-graph-max-bs 64 is unused: decode CUDA graphs are off (flag --enforce-eager)",
        ),
        (
            ["--enforce-eager", "--decode-cuda-graph-bs", "1,2", "--decode-cuda-graph-max-bs", "8"],
            "--decode-cuda-graph-bs [1, 2] and --decode-cuda-graph-max-bs 8 are unused: decode CUDA graphs are off "
            "(flag --enforce-eager)",
        ),
        (
            ["--cudagraph-mode", "FULL_DECODE_ONLY", "--prefill-cuda-graph-max-padding-ratio", "2"],
            "--prefill-cuda-graph-max-padding-ratio 2.0 is unused: prefill CUDA graphs are off (flag --cudagraph-mode)",
        ),
    ],
)
def test_settings_of_a_phase_the_user_turned_off_are_said_to_be_unused(
    argv: list[str], line: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="cudagraph.config"), recorded_warnings():
        resolve_argv(argv)
    assert [(record.levelno, record.getMessage()) for record in caplog.records] == [(logging.WARNING, line)]


def test_enforce_eager_alone_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="cudagraph.config"):
        resolve_argv(["--enforce-eager"])
    assert caplog.records == []


def test_settings_of_a_phase_a_rule_turned_off_are_said_to_be_unused_at_info(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="cudagraph.config"):
        resolve_argv(["--decode-cuda-graph-max-bs", "64"], environment=Environment(device_type="cpu"))
    assert [(record.levelno, record.getMessage()) for record in caplog.records][1:] == [
        (
            logging.INFO,
            "--decode-cuda-graph-max-bs 64 is unused: decode CUDA graphs are off (rule non_cuda_device: CUDA graphs "
            "need a CUDA device, and the device type is 'cpu')",
        )
    ]


def test_capture_sizes_keywords_and_flags(no_warnings: object) -> None:
    expected = resolve(decode_cuda_graph_bs=[1, 2, 4], decode_cuda_graph_max_bs=8)
    assert resolve(cudagraph_capture_sizes=[4, 2, 1], max_cudagraph_capture_size=8) == expected
    config = resolve_argv(["--cudagraph-capture-sizes", "1,2", "4", "--max-cudagraph-capture-size", "8"])
    assert config == expected
    assert config.decode.buckets == (1, 2, 4, 8)
    assert config.sources["decode.buckets"] == (
        "flag --cudagraph-capture-sizes (max 8 from --max-cudagraph-capture-size appended as the last bucket)"
    )


def test_vllm_spellings_sit_below_json_and_above_legacy_flags() -> None:
    with recorded_warnings() as caught:
        config = resolve_argv(
            ["--cuda-graph-mode", '{"decode": "breakable"}', "--cudagraph-mode", "PIECEWISE", "--disable-cuda-graph"]
        )
    assert (config.decode.backend, config.prefill.backend) == (Backend.BREAKABLE, Backend.TC_PIECEWISE)
    assert [str(w.message) for w in caught if w.category is OverriddenSettingWarning] == [
        "decode.backend: --cuda-graph-mode 'breakable' overrides --cudagraph-mode 'tc_piecewise' and "
        "--disable-cuda-graph 'disabled'",
        "prefill.backend: --cudagraph-mode 'tc_piecewise' overrides --disable-cuda-graph 'disabled'",
    ]


def test_vllm_mode_does_not_lock_phases_against_rules() -> None:
    config = resolve_argv(["--cudagraph-mode", "PIECEWISE"], environment=Environment(lora=True))
    assert config.prefill.backend is Backend.DISABLED and config.sources["prefill.backend"].startswith("rule lora")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--cudagraph-mode", "PIECEWISE", "--decode-cuda-graph-backend", "breakable"],
            "decode.backend: --decode-cuda-graph-backend gives 'breakable' but --cudagraph-mode gives 'tc_piecewise'; "
            "both have the same precedence, so give only one",
        ),
        (
            ["--enforce-eager", "--cuda-graph-backend-prefill", "tc_piecewise"],
            "prefill.backend: --cuda-graph-backend-prefill gives 'tc_piecewise' but --enforce-eager gives 'disabled'; "
            "both have the same precedence, so give only one",
        ),
        (
            ["--cudagraph-mode", "FULL_DECODE_ONLY", "--compilation-config", '{"cudagraph_mode": "NONE"}'],
            "decode.backend: --cudagraph-mode gives 'full' but --compilation-config gives 'disabled'; "
            "both have the same precedence, so give only one",
        ),
        (
            ["--compilation-config", '{"cudagraph_capture_sizes": [1, 2]}', "--decode-cuda-graph-bs", "4"],
            "decode.buckets: --decode-cuda-graph-bs gives [4] but --compilation-config gives [1, 2]; "
            "both have the same precedence, so give only one",
        ),
        (
            ["--cudagraph-capture-sizes", "8", "--cuda-graph-bs-decode", "16"],
            "decode.buckets: --cuda-graph-bs-decode gives [16] but --cudagraph-capture-sizes gives [8]; "
            "both have the same precedence, so give only one",
        ),
    ],
)
def test_disagreeing_with_a_flag_of_the_same_level_is_one_error(argv: list[str], message: str) -> None:
    with recorded_warnings() as caught, pytest.raises(ConfigError) as error:
        resolve_argv(argv)
    assert str(error.value) == message
    assert caught == []


def test_agreeing_with_a_flag_of_the_same_level_is_fine(no_warnings: object) -> None:
    config = resolve_argv(
        [
            *("--cudagraph-mode", "FULL_DECODE_ONLY", "--decode-cuda-graph-backend", "full"),
            *("--disable-prefill-cuda-graph", "--compilation-config", '{"cudagraph_mode": "full_decode_only"}'),
        ]
    )
    assert (config.decode.backend, config.prefill.backend) == (Backend.FULL, Backend.DISABLED)


# (argv, the same as keywords, exact message)
ERRORS = [
    (
        ["--cudagraph-mode", "EAGER"],
        {"cudagraph_mode": "EAGER"},
        f"--cudagraph-mode: unknown vLLM CUDA-graph mode 'EAGER'; allowed: {ALLOWED_MODES}",
    ),
    (
        ["--cudagraph-mode", '{"decode": "full"}'],
        {"cudagraph_mode": '{"decode": "full"}'},
        '--cudagraph-mode: unknown vLLM CUDA-graph mode \'{"decode": "full"}\'; '
        f"allowed: {ALLOWED_MODES}; a per-phase JSON object goes to --cuda-graph-mode",
    ),
    (
        ["--compilation-config", '{"cudagraph_mode": 2}'],
        {"compilation_config": '{"cudagraph_mode": 2}'},
        "--compilation-config: cudagraph_mode must be a mode name string "
        "(NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE), got number 2",
    ),
    (
        ["--compilation-config", '{"cudagraph_mode": "fastest"}'],
        {"compilation_config": {"cudagraph_mode": "fastest"}},
        f"--compilation-config cudagraph_mode: unknown vLLM CUDA-graph mode 'fastest'; allowed: {ALLOWED_MODES}",
    ),
    (
        ["--compilation-config", '{"cudagraph_capture_sizes": "1,2,4"}'],
        {"compilation_config": '{"cudagraph_capture_sizes": "1,2,4"}'},
        "--compilation-config: cudagraph_capture_sizes must be an array of integers, got string '1,2,4'",
    ),
    (
        ["--compilation-config", '{"cudagraph_capture_sizes": [1, 2.5]}'],
        {"compilation_config": '{"cudagraph_capture_sizes": [1, 2.5]}'},
        "--compilation-config: cudagraph_capture_sizes must be an array of integers, got array [1, 2.5]",
    ),
    (
        ["--compilation-config", '{"cudagraph_capture_sizes": [1, true]}'],
        {"compilation_config": '{"cudagraph_capture_sizes": [1, true]}'},
        "--compilation-config: cudagraph_capture_sizes must be an array of integers, got array [1, True]",
    ),
    (
        ["--compilation-config", '{"cudagraph_capture_sizes": [0, 8]}'],
        {"compilation_config": '{"cudagraph_capture_sizes": [0, 8]}'},
        "--compilation-config cudagraph_capture_sizes: 0 is not positive; allowed: positive integers",
    ),
    (
        ["--compilation-config", '{"cudagraph_capture_sizes": []}'],
        {"compilation_config": '{"cudagraph_capture_sizes": []}'},
        "--compilation-config cudagraph_capture_sizes: empty list; allowed: one or more positive integers",
    ),
    (
        ["--compilation-config", '{"max_cudagraph_capture_size": "512"}'],
        {"compilation_config": '{"max_cudagraph_capture_size": "512"}'},
        "--compilation-config: max_cudagraph_capture_size must be an integer, got string '512'",
    ),
    (
        ["--compilation-config", '{"cudagraph_capture_sizes": [8, 64], "max_cudagraph_capture_size": 32}'],
        {"compilation_config": '{"cudagraph_capture_sizes": [8, 64], "max_cudagraph_capture_size": 32}'},
        "--compilation-config: 64 exceeds the maximum 32 given by --compilation-config; "
        "allowed: positive integers up to 32",
    ),
    (
        ["--compilation-config", "[1, 2]"],
        {"compilation_config": "[1, 2]"},
        "--compilation-config: expected vLLM's compilation config as a JSON object, got array '[1, 2]'; "
        'e.g. {"cudagraph_mode": "FULL_AND_PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4, 8]}',
    ),
    (
        ["--compilation-config", "{level: 3}"],
        {"compilation_config": "{level: 3}"},
        "--compilation-config: malformed JSON '{level: 3}' (Expecting property name enclosed in double quotes at "
        'char 1); expected an object like {"cudagraph_mode": "FULL_AND_PIECEWISE", "cudagraph_capture_sizes": '
        "[1, 2, 4, 8]}",
    ),
    (
        ["--compilation-config", '{"level": 3, "level": 2}'],
        {"compilation_config": '{"level": 3, "level": 2}'},
        "--compilation-config: key 'level' is given twice; give each key at most once",
    ),
    (
        ["--cudagraph-capture-sizes", "1", "x"],
        {"cudagraph_capture_sizes": [1, "x"]},
        "--cudagraph-capture-sizes: 'x' is not an integer; allowed: positive integers",
    ),
]


@pytest.mark.parametrize(("argv", "keywords", "message"), ERRORS, ids=[case[2][:70] for case in ERRORS])
def test_errors_name_what_was_wrong_and_what_is_allowed(
    argv: list[str], keywords: dict[str, object], message: str
) -> None:
    with recorded_warnings() as caught:
        with pytest.raises(ConfigError) as from_flags:
            resolve_argv(argv)
        with pytest.raises(ConfigError) as from_keywords:
            resolve(**keywords)
    assert str(from_flags.value) == str(from_keywords.value) == message
    assert caught == []


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"enforce_eager": "yes"}, "--enforce-eager: expected True or False, got 'yes'"),
        (
            {"cudagraph_mode": {"decode": "full"}},
            f"--cudagraph-mode: unknown vLLM CUDA-graph mode {{'decode': 'full'}}; allowed: {ALLOWED_MODES}; "
            "a per-phase JSON object goes to --cuda-graph-mode",
        ),
        (
            {"compilation_config": 3},
            "--compilation-config: expected JSON text, got 3; "
            'e.g. {"cudagraph_mode": "FULL_AND_PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4, 8]}',
        ),
    ],
)
def test_python_only_errors(keywords: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        resolve(**keywords)
    assert str(error.value) == message
