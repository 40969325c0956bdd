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


def test_agreeing_with_a_flag_of_the_same_level_is_fine(no_warnings: object) -> None:
    config = resolve_argv(
        [
            *("--cudagraph-mode", "FULL_DECODE_ONLY", "--decode-cuda-graph-backend", "full"),
            *("--disable-prefill-cuda-graph", "--compilation-config", '{"cudagraph_mode": "full_decode_only"}'),
        ]
    )
    assert (config.decode.backend, config.prefill.backend) == (Backend.FULL, Backend.DISABLED)
