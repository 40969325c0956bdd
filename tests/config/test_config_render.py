"""to_dict, explain and to_cli_args of a resolved config."""

from __future__ import annotations

import json

import pytest
from config_helpers import parse, recorded_warnings

from cudagraph.config import Backend, ConfigError, CudaGraphConfig, Environment, PhaseConfig, default_buckets, resolve


def test_to_dict_holds_backend_names_and_the_rest() -> None:
    config = resolve(decode_cuda_graph_max_bs=8, prefill_disable_cuda_graph=True, enable_cudagraph_gc=True)
    data = config.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data == {
        "decode": "full",
        "decode_buckets": [1, 2, 4, 8],
        "decode_max_size": 8,
        "decode_max_padding_ratio": None,
        "decode_memory_budget": None,
        "decode_capture_policy": "eager",
        "prefill": "disabled",
        "prefill_buckets": [],
        "prefill_max_size": 0,
        "prefill_max_padding_ratio": None,
        "prefill_memory_budget": None,
        "prefill_capture_policy": "eager",
        "tc_piecewise_compiler": "eager",
        "torch_compile_max_bs": 0,
        "torch_compile_mode": None,
        "compile_cache_dir": None,
        "debug": False,
        "enable_gc": True,
        "disable_padding": False,
        "profile_capture": False,
        "sources": dict(config.sources),
    }


def test_to_dict_holds_the_sizing_settings_as_json() -> None:
    config = resolve(
        decode_cuda_graph_max_padding_ratio="1.5",
        prefill_cuda_graph_memory_budget="20%",
        decode_cuda_graph_memory_budget=1.5,
        tc_piecewise_compile_cache_dir="/cache/inductor",
    )
    data = config.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert (data["decode_max_padding_ratio"], data["prefill_max_padding_ratio"]) == (1.5, None)
    assert (data["decode_memory_budget"], data["prefill_memory_budget"]) == ("1.5GiB", "20%")
    assert data["compile_cache_dir"] == "/cache/inductor"


def test_explain_names_every_source_kind() -> None:
    with recorded_warnings():
        config = resolve(
            parse(["--cuda-graph-mode", '{"decode": "breakable"}', "--cuda-graph-max-bs", "16", "--debug-cuda-graph"]),
            environment=Environment(lora=True),
        )
    lines = {line.split()[0]: line for line in config.explain().splitlines()}
    assert list(lines) == [
        "decode.backend",
        "decode.buckets",
        "decode.max_size",
        "decode.max_padding_ratio",
        "decode.memory_budget",
        "decode.capture_policy",
        "prefill.backend",
        "prefill.buckets",
        "prefill.max_size",
        "prefill.max_padding_ratio",
        "prefill.memory_budget",
        "prefill.capture_policy",
        "tc_piecewise_compiler",
        "torch_compile_max_bs",
        "torch_compile_mode",
        "compile_cache_dir",
        "debug",
        "enable_gc",
        "disable_padding",
        "profile_capture",
        "decode.captures",
        "decode.steps",
        "decode.captured",
        "decode.grid",
        "decode.padding",
        "decode.replays",
        "prefill.captures",  # prefill is off by the lora rule: no grid
        "prefill.steps",
    ]
    assert "uniform steps" in lines["decode.steps"] and "speculative verify" in lines["decode.steps"]
    assert "prefill mixed with decodes" in lines["prefill.steps"]
    assert lines["decode.backend"].split() == ["decode.backend", "breakable", "json", "--cuda-graph-mode"]
    assert lines["decode.buckets"].split()[1:7] == ["1", "2", "4", "8", "16", "(5)"]
    assert lines["decode.max_size"].endswith("legacy flag --cuda-graph-max-bs")
    assert "rule lora: " in lines["prefill.backend"]
    assert lines["debug"].split() == ["debug", "True", "flag", "--debug-cuda-graph"]
    assert lines["enable_gc"].split() == ["enable_gc", "False", "default"]
    assert lines["prefill.max_padding_ratio"].split() == [
        "prefill.max_padding_ratio",
        "None",
        "derived",
        "from",
        "prefill.backend",
        "disabled",
    ]
    assert lines["decode.grid"].split()[1:] == ["5", "buckets:", "1", "2", "4", "8", "16"]


def test_explain_abbreviates_long_lists() -> None:
    line = resolve().explain().splitlines()[1]
    assert "1 2 4 8 16 24 ... 240 248 256 (35)" in line


ROUND_TRIP_CASES = [
    {},
    {"decode_cuda_graph_bs": [3, 1], "decode_cuda_graph_max_bs": 64},
    {"decode_cuda_graph_max_bs": 300, "prefill_cuda_graph_tokens": [16, 48]},
    {"cuda_graph_mode": '{"decode": "tc_piecewise", "prefill": "tc_piecewise"}', "tc_piecewise_compiler": "inductor"},
    {"disable_cuda_graph": True, "debug_cuda_graph": True, "disable_cuda_graph_padding": True},
    {"enable_profile_cuda_graph": True, "enable_cudagraph_gc": True},
    {"torch_compile_max_bs": 16, "torch_compile_mode": "max-autotune-no-cudagraphs"},
    {"decode_disable_cuda_graph": True, "torch_compile_mode": "default"},  # kept although unused
    {"cudagraph_mode": "PIECEWISE", "tc_piecewise_compiler": "inductor", "torch_compile_mode": "lite"},
]


@pytest.mark.parametrize("keywords", ROUND_TRIP_CASES)
@pytest.mark.parametrize(
    "environment", [Environment(), Environment(device_type="cpu"), Environment(mla_attention=True, gpu_memory_gib=16)]
)
def test_to_cli_args_resolves_back_in_any_environment(keywords: dict[str, object], environment: Environment) -> None:
    with recorded_warnings():
        config = resolve(environment=environment, **keywords)
    for other in (Environment(), Environment(lora=True, device_type="cpu", gpu_memory_gib=141)):
        with recorded_warnings() as caught:
            again = resolve(parse(config.to_cli_args()), environment=other)
        assert again == config
        assert caught == []  # canonical flags are modern and never fight each other


def test_to_cli_args_is_compact_for_default_schedules() -> None:
    assert resolve().to_cli_args() == [
        "--cuda-graph-mode",
        '{"decode": "full", "prefill": "breakable"}',
        "--decode-cuda-graph-max-bs",
        "256",
        "--prefill-cuda-graph-max-tokens",
        "2048",
    ]
    # 1 2 with the max 4 appended is the default schedule up to 4, which the max alone says.
    args = resolve(decode_cuda_graph_bs=[2, 1], decode_cuda_graph_max_bs=4).to_cli_args()
    assert args[2:] == ["--decode-cuda-graph-max-bs", "4", "--prefill-cuda-graph-max-tokens", "2048"]
    args = resolve(decode_cuda_graph_bs=[3, 1], decode_cuda_graph_max_bs=64).to_cli_args()
    assert args[2:] == ["--decode-cuda-graph-bs", "1", "3", "64", "--prefill-cuda-graph-max-tokens", "2048"]


def test_hand_built_config_round_trips() -> None:
    config = CudaGraphConfig(
        decode=PhaseConfig(Backend.BREAKABLE, (1, 2, 4, 8, 16), 16),
        prefill=PhaseConfig(Backend.TC_PIECEWISE, (64, 128, 512), 512),
        tc_piecewise_compiler="inductor",
        enable_gc=True,
    )
    assert resolve(parse(config.to_cli_args())) == config
    assert config.decode.buckets == default_buckets("decode", 16)


def test_enabled_phase_without_buckets_cannot_be_written() -> None:
    config = CudaGraphConfig(decode=PhaseConfig(Backend.FULL, (), 0), prefill=PhaseConfig(Backend.DISABLED, (), 0))
    with pytest.raises(ConfigError, match="decode: backend full with no buckets cannot be written as flags"):
        config.to_cli_args()


def test_sources_do_not_affect_equality() -> None:
    with recorded_warnings():
        legacy = resolve(cuda_graph_bs=[1, 2])
    modern = resolve(decode_cuda_graph_bs=[1, 2])
    assert legacy == modern and legacy.sources != modern.sources


def test_compile_mode_is_written_after_the_compile_size() -> None:
    config = resolve(torch_compile_max_bs=32, torch_compile_mode="max-autotune-no-cudagraphs")
    assert config.to_cli_args()[-4:] == [
        "--torch-compile-max-bs",
        "32",
        "--torch-compile-mode",
        "max-autotune-no-cudagraphs",
    ]
    assert resolve(parse(config.to_cli_args())).torch_compile_mode == "max-autotune-no-cudagraphs"
