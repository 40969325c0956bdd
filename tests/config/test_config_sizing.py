"""Graph sizing settings: padding ratios and memory budgets per phase (flags and ``--cuda-graph-mode`` objects), the
compile cache directory, and the largest size always captured."""

from __future__ import annotations

import json
from pathlib import PurePosixPath

import pytest
from config_helpers import help_text, parse, recorded_warnings, resolve_argv

from cudagraph.config import (
    Backend,
    ConfigError,
    CudaGraphConfig,
    Environment,
    MemoryBudget,
    OverriddenSettingWarning,
    PhaseConfig,
    resolve,
)
from cudagraph.config.resolve_command import main

GIB = 2**30


def test_defaults_set_no_limit(no_warnings: object) -> None:
    config = resolve()
    for phase in (config.decode, config.prefill):
        assert (phase.max_padding_ratio, phase.memory_budget) == (None, None)
    assert config.compile_cache_dir is None
    for key in ("decode.max_padding_ratio", "prefill.memory_budget", "compile_cache_dir"):
        assert config.sources[key] == "default"


def test_the_phase_object_of_the_json(no_warnings: object) -> None:
    mode = {"decode": {"backend": "full", "max_padding_ratio": 1.5, "memory_budget": "2GiB"}, "prefill": "breakable"}
    config = resolve_argv(["--cuda-graph-mode", json.dumps(mode)])
    assert config.decode == PhaseConfig(
        Backend.FULL, config.decode.buckets, 256, max_padding_ratio=1.5, memory_budget=MemoryBudget(bytes=2 * GIB)
    )
    assert config.prefill.backend is Backend.BREAKABLE and config.prefill.max_padding_ratio is None
    for key in ("decode.backend", "decode.max_padding_ratio", "decode.memory_budget", "prefill.backend"):
        assert config.sources[key] == "json --cuda-graph-mode"
    assert config == resolve(cuda_graph_mode=mode)  # a dict from Python
    assert config == resolve_argv(
        [
            *("--decode-cuda-graph-max-padding-ratio", "1.5"),
            *("--decode-cuda-graph-memory-budget", "2GiB"),
            *("--cuda-graph-mode", '{"decode": "full", "prefill": "breakable"}'),
        ]
    )


def test_a_json_value_outranks_the_per_phase_flag_and_warns_naming_both() -> None:
    with recorded_warnings() as caught:
        config = resolve_argv(
            [
                *("--cuda-graph-mode", '{"decode": {"max_padding_ratio": 1.25}}'),
                *("--decode-cuda-graph-max-padding-ratio", "2"),
                *("--decode-cuda-graph-memory-budget", "10%"),
            ]
        )
    assert config.decode.max_padding_ratio == 1.25
    assert config.decode.memory_budget == MemoryBudget(free_fraction=0.1)  # the JSON says nothing of it
    assert config.sources["decode.memory_budget"] == "flag --decode-cuda-graph-memory-budget"
    assert [(w.category, str(w.message)) for w in caught] == [
        (
            OverriddenSettingWarning,
            "decode.max_padding_ratio: --cuda-graph-mode 1.25 overrides --decode-cuda-graph-max-padding-ratio 2.0",
        )
    ]


def test_the_two_json_spellings_disagreeing_on_a_value_is_an_error() -> None:
    with pytest.raises(ConfigError) as error:
        resolve_argv(
            [
                "--cuda-graph-mode",
                '{"prefill": {"memory_budget": "1GiB"}}',
                "--cuda-graph-config",
                '{"prefill": {"memory_budget": "2GiB"}}',
            ]
        )
    assert str(error.value) == (
        "prefill.memory_budget: --cuda-graph-mode gives 1GiB but --cuda-graph-config gives 2GiB; both have the same "
        "precedence, so give only one"
    )
    # The same amount in other words agrees.
    agreeing = resolve(
        cuda_graph_mode='{"prefill": {"memory_budget": "1GiB"}}',
        cuda_graph_config={"prefill": {"memory_budget": "1024MiB", "max_padding_ratio": 2}},
    )
    assert agreeing.prefill.memory_budget == MemoryBudget(bytes=GIB) and agreeing.prefill.max_padding_ratio == 2


def test_an_object_without_a_backend_leaves_the_phase_to_rules() -> None:
    lora = Environment(lora=True)
    unlocked = resolve(cuda_graph_mode={"prefill": {"memory_budget": "1GiB"}}, environment=lora)
    assert unlocked.prefill.backend is Backend.DISABLED and unlocked.prefill.memory_budget is None
    assert unlocked.sources["prefill.memory_budget"] == "derived from prefill.backend disabled"
    locked = resolve(cuda_graph_mode={"prefill": {"backend": "breakable", "memory_budget": "1GiB"}}, environment=lora)
    assert locked.prefill.backend is Backend.BREAKABLE and locked.prefill.memory_budget == MemoryBudget(bytes=GIB)


def test_a_disabled_phase_keeps_no_limits_but_checks_them(no_warnings: object) -> None:
    config = resolve(
        prefill_disable_cuda_graph=True,
        prefill_cuda_graph_max_padding_ratio=3,
        prefill_cuda_graph_memory_budget="1GiB",
    )
    assert config.prefill == PhaseConfig(Backend.DISABLED, (), 0)
    assert config.sources["prefill.max_padding_ratio"] == "derived from prefill.backend disabled"
    with pytest.raises(ConfigError, match=r"^--prefill-cuda-graph-max-padding-ratio: 0\.5 is not allowed"):
        resolve(prefill_disable_cuda_graph=True, prefill_cuda_graph_max_padding_ratio=0.5)


@pytest.mark.parametrize(
    ("argv", "buckets", "source"),
    [
        (
            ["--decode-cuda-graph-bs", "1", "2", "4", "--decode-cuda-graph-max-bs", "64"],
            (1, 2, 4, 64),
            "flag --decode-cuda-graph-bs (max 64 from --decode-cuda-graph-max-bs appended as the last bucket)",
        ),
        (
            ["--prefill-cuda-graph-tokens", "64", "--prefill-cuda-graph-max-tokens", "512"],
            (64, 512),
            "flag --prefill-cuda-graph-tokens (max 512 from --prefill-cuda-graph-max-tokens appended as the last "
            "bucket)",
        ),
        (
            ["--cuda-graph-bs", "8", "--decode-cuda-graph-max-bs", "16"],
            (8, 16),
            "legacy flag --cuda-graph-bs (max 16 from --decode-cuda-graph-max-bs appended as the last bucket)",
        ),
        (["--decode-cuda-graph-bs", "1", "2", "4", "--decode-cuda-graph-max-bs", "4"], (1, 2, 4), None),
    ],
)
def test_the_max_is_appended_when_above_the_given_buckets(
    argv: list[str], buckets: tuple[int, ...], source: str | None
) -> None:
    with recorded_warnings():
        config = resolve_argv(argv)
    phase = config.decode if config.decode.buckets != resolve().decode.buckets else config.prefill
    assert phase.buckets == buckets and phase.max_size == buckets[-1]
    key = "decode.buckets" if phase is config.decode else "prefill.buckets"
    assert config.sources[key] == (source or f"flag {argv[0]}")
    grid = next(line for line in config.explain().splitlines() if line.startswith(key.replace("buckets", "grid")))
    assert grid.endswith(f"(the max {buckets[-1]} appended as the last bucket)") is (source is not None)


def test_compile_cache_dir_is_kept_as_written() -> None:
    config = resolve(
        tc_piecewise_compile_cache_dir=PurePosixPath("~/cache/inductor"),
        prefill_cuda_graph_backend="tc_piecewise",
        tc_piecewise_compiler="inductor",
    )
    assert config.compile_cache_dir == "~/cache/inductor"  # no expansion, nothing created
    assert config.sources["compile_cache_dir"] == "flag --tc-piecewise-compile-cache-dir"
    unused = resolve(tc_piecewise_compile_cache_dir="/cache")
    assert unused.compile_cache_dir == "/cache"
    assert unused.sources["compile_cache_dir"].startswith(
        "flag --tc-piecewise-compile-cache-dir (unused: nothing compiles with inductor;"
    )


@pytest.mark.parametrize(
    "keywords",
    [
        {"decode_cuda_graph_max_padding_ratio": 1.0 + 2**-40, "prefill_cuda_graph_memory_budget": "33.3%"},
        {"cuda_graph_mode": {"decode": {"memory_budget": 1.1}}, "prefill_cuda_graph_max_padding_ratio": 7},
        {"tc_piecewise_compile_cache_dir": "-cache dir", "torch_compile_max_bs": 8},
        {"decode_cuda_graph_bs": [1, 3], "decode_cuda_graph_max_bs": 300, "decode_cuda_graph_memory_budget": "123B"},
    ],
)
def test_to_cli_args_carries_the_sizing_settings(keywords: dict[str, object]) -> None:
    config = resolve(**keywords)
    with recorded_warnings() as caught:
        again = resolve(parse(config.to_cli_args()))
    assert again == config and caught == []
    assert again.decode.memory_budget == config.decode.memory_budget  # equal, not merely close


def test_to_cli_args_spells_each_setting() -> None:
    config = resolve(
        decode_cuda_graph_max_padding_ratio="1.5",
        decode_cuda_graph_memory_budget="1.5GiB",
        prefill_cuda_graph_memory_budget="20%",
        tc_piecewise_compile_cache_dir="-c",
    )
    assert config.to_cli_args()[2:] == [
        "--decode-cuda-graph-max-bs",
        "256",
        "--decode-cuda-graph-max-padding-ratio",
        "1.5",
        "--decode-cuda-graph-memory-budget",
        "1.5GiB",
        "--prefill-cuda-graph-max-tokens",
        "2048",
        "--prefill-cuda-graph-memory-budget",
        "20%",
        "--tc-piecewise-compile-cache-dir=-c",  # glued, or argparse would read -c as an option
    ]


def test_a_max_that_is_not_the_last_bucket_cannot_be_written() -> None:
    config = CudaGraphConfig(
        decode=PhaseConfig(Backend.FULL, (1, 2, 4), 64), prefill=PhaseConfig(Backend.DISABLED, (), 0)
    )
    with pytest.raises(ConfigError) as error:
        config.to_cli_args()
    assert str(error.value) == (
        "decode: max_size 64 is not the last bucket 4, which flags cannot give (resolve always ends the buckets at "
        "the max); make the max the last bucket"
    )


def test_help_shows_the_budget_spellings() -> None:
    text = help_text()
    assert (
        '--decode-cuda-graph-memory-budget SIZE the most device memory the decode graphs may take: "1.5GiB", ' in text
    )
    assert '"20%" (of the free memory at capture)' in text
    assert "--prefill-cuda-graph-max-padding-ratio RATIO a prefill batch whose bucket is more than RATIO times" in text


@pytest.mark.parametrize(
    ("config", "sizes", "expected"),
    [
        (PhaseConfig(Backend.FULL, (1, 2, 4, 8), 8), (0, 1, 3, 8, 9), (None, 1, 4, 8, None)),
        (PhaseConfig(Backend.FULL, (1, 2, 4, 8), 8, max_padding_ratio=1.5), (3, 5, 6), (4, None, 8)),
        (PhaseConfig(Backend.FULL, (16, 32), 32, max_padding_ratio=1.0), (16, 17, 32), (16, None, 32)),
        (PhaseConfig(Backend.DISABLED, (), 0), (1,), (None,)),
    ],
)
def test_bucket_for(config: PhaseConfig, sizes: tuple[int, ...], expected: tuple[int | None, ...]) -> None:
    assert tuple(config.bucket_for(size) for size in sizes) == expected


def test_cli_plain_output_and_explain_show_the_settings(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--decode-cuda-graph-max-bs", "8", "--decode-cuda-graph-max-padding-ratio", "1.5"]
    assert main(["resolve", *argv, "--prefill-cuda-graph-memory-budget", "1GiB"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "decode: full buckets=[1, 2, 4, 8] max=8 max_padding_ratio=1.5"
    assert lines[1].endswith("max=2048 memory_budget=1GiB")
    assert "compile_cache_dir=None" in lines[2]
    assert main(["resolve", "--explain", *argv]) == 0
    explained = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert explained["decode.max_padding_ratio"].split() == [
        "decode.max_padding_ratio",
        "1.5",
        "flag",
        "--decode-cuda-graph-max-padding-ratio",
    ]
    assert explained["decode.replays"].endswith("max_padding_ratio 1.5 sends 5 eagerly (1 size)")
