"""Every ConfigError (of our spellings and vLLM's): the message names the flag or key, the bad value and what is
allowed; both routes agree."""

from __future__ import annotations

import pytest
from config_helpers import recorded_warnings, resolve_argv

from cudagraph.config import ConfigError, Environment, resolve

RATIO_ALLOWED = "a number >= 1, e.g. 1.5 (a batch whose bucket is more than 1.5 times its size runs eagerly)"
BUDGET_ALLOWED = (
    'a positive amount, "1.5GiB", "512MiB", "2" (GiB) or "20%" (of the free memory at capture), a share up to 100%'
)
ALLOWED_MODES = "NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE"
PHASE_OBJECT = '{"decode": {"backend": "full", "max_padding_ratio": 1.5, "memory_budget": "2GiB"}}'

# (argv, the same input as keywords, exact message)
CASES = [
    (
        ["--cuda-graph-mode", '{"dcode": "full"}'],
        {"cuda_graph_mode": '{"dcode": "full"}'},
        "--cuda-graph-mode: unknown phase 'dcode'; allowed phases: decode, prefill",
    ),
    (
        ["--cuda-graph-mode", '{"decode": "fulll"}'],
        {"cuda_graph_mode": '{"decode": "fulll"}'},
        "--cuda-graph-mode: unknown backend 'fulll' for decode; "
        "allowed backends: full, breakable, tc_piecewise, disabled",
    ),
    (
        ["--cuda-graph-mode", '{"decode": 1}'],
        {"cuda_graph_mode": '{"decode": 1}'},
        "--cuda-graph-mode: unknown backend 1 for decode; allowed backends: full, breakable, tc_piecewise, disabled",
    ),
    (
        ["--cuda-graph-mode", '{"prefill": "fulll"}'],
        {"cuda_graph_mode": '{"prefill": "fulll"}'},
        "--cuda-graph-mode: unknown backend 'fulll' for prefill; "
        "allowed backends: full, breakable, tc_piecewise, disabled",
    ),
    (
        ["--cuda-graph-mode", "{decode: full}"],
        {"cuda_graph_mode": "{decode: full}"},
        "--cuda-graph-mode: malformed JSON '{decode: full}' "
        "(Expecting property name enclosed in double quotes at char 1); "
        'expected an object like {"decode": "full", "prefill": "breakable"}',
    ),
    (
        ["--cuda-graph-mode", '["decode"]'],
        {"cuda_graph_mode": '["decode"]'},
        "--cuda-graph-mode: expected a JSON object mapping phase to backend, got array '[\"decode\"]'; "
        'e.g. {"decode": "full", "prefill": "breakable"}',
    ),
    (
        ["--cuda-graph-mode", '"full"'],
        {"cuda_graph_mode": '"full"'},
        "--cuda-graph-mode: expected a JSON object mapping phase to backend, got string '\"full\"'; "
        'e.g. {"decode": "full", "prefill": "breakable"}',
    ),
    (
        ["--cuda-graph-mode", '{"decode": "full", "decode": "disabled"}'],
        {"cuda_graph_mode": '{"decode": "full", "decode": "disabled"}'},
        "--cuda-graph-mode: phase 'decode' is given twice; give each phase at most once",
    ),
    (
        ["--decode-cuda-graph-backend", "graph"],
        {"decode_cuda_graph_backend": "graph"},
        "--decode-cuda-graph-backend: unknown backend 'graph' for decode; "
        "allowed backends: full, breakable, tc_piecewise, disabled",
    ),
    (
        ["--prefill-cuda-graph-backend", "graph"],
        {"prefill_cuda_graph_backend": "graph"},
        "--prefill-cuda-graph-backend: unknown backend 'graph' for prefill; "
        "allowed backends: full, breakable, tc_piecewise, disabled",
    ),
    (
        ["--decode-cuda-graph-bs", "1", "0"],
        {"decode_cuda_graph_bs": [1, 0]},
        "--decode-cuda-graph-bs: 0 is not positive; allowed: positive integers",
    ),
    (
        ["--decode-cuda-graph-bs", "-3"],
        {"decode_cuda_graph_bs": [-3]},
        "--decode-cuda-graph-bs: -3 is not positive; allowed: positive integers",
    ),
    (
        ["--prefill-cuda-graph-tokens", "1.5"],
        {"prefill_cuda_graph_tokens": ["1.5"]},
        "--prefill-cuda-graph-tokens: '1.5' is not an integer; allowed: positive integers",
    ),
    (
        ["--decode-cuda-graph-bs", "1,2,"],
        {"decode_cuda_graph_bs": ["1,2,"]},
        "--decode-cuda-graph-bs: '1,2,' has an empty entry; allowed: positive integers separated by spaces or commas",
    ),
    (
        ["--decode-cuda-graph-bs", "1,x,4"],
        {"decode_cuda_graph_bs": "1,x,4"},
        "--decode-cuda-graph-bs: 'x' is not an integer; allowed: positive integers",
    ),
    (
        ["--cuda-graph-bs", "x"],
        {"cuda_graph_bs": ["x"]},
        "--cuda-graph-bs: 'x' is not an integer; allowed: positive integers",
    ),
    (
        ["--decode-cuda-graph-max-bs", "0"],
        {"decode_cuda_graph_max_bs": 0},
        "--decode-cuda-graph-max-bs: 0 is not positive; allowed: positive integers",
    ),
    (
        ["--piecewise-cuda-graph-max-tokens", "lots"],
        {"piecewise_cuda_graph_max_tokens": "lots"},
        "--piecewise-cuda-graph-max-tokens: 'lots' is not an integer; allowed: positive integers",
    ),
    (
        ["--decode-cuda-graph-bs", "8", "300", "--decode-cuda-graph-max-bs", "256"],
        {"decode_cuda_graph_bs": [8, 300], "decode_cuda_graph_max_bs": 256},
        "--decode-cuda-graph-bs: 300 exceeds the maximum 256 given by --decode-cuda-graph-max-bs; "
        "allowed: positive integers up to 256",
    ),
    (
        ["--piecewise-cuda-graph-tokens", "4096", "--prefill-cuda-graph-max-tokens", "2048"],
        {"piecewise_cuda_graph_tokens": [4096], "prefill_cuda_graph_max_tokens": 2048},
        "--piecewise-cuda-graph-tokens: 4096 exceeds the maximum 2048 given by --prefill-cuda-graph-max-tokens; "
        "allowed: positive integers up to 2048",
    ),
    (
        ["--tc-piecewise-compiler", "nvfuser"],
        {"tc_piecewise_compiler": "nvfuser"},
        "--tc-piecewise-compiler: unknown compiler 'nvfuser'; allowed: eager, inductor",
    ),
    (
        ["--torch-compile-mode", "max_autotune"],
        {"torch_compile_mode": "max_autotune"},
        "--torch-compile-mode: unknown torch.compile mode 'max_autotune'; allowed: default, "
        "max-autotune-no-cudagraphs, lite",
    ),
    (
        ["--torch-compile-max-bs", "8", "--torch-compile-mode", "reduce-overhead"],
        {"torch_compile_max_bs": 8, "torch_compile_mode": "reduce-overhead"},
        "--torch-compile-mode: torch.compile mode 'reduce-overhead' captures its own CUDA graphs, which would be "
        "captured inside ours; allowed: default, max-autotune-no-cudagraphs, lite",
    ),
    (
        ["--torch-compile-mode", "max-autotune"],
        {"torch_compile_mode": "max-autotune"},
        "--torch-compile-mode: torch.compile mode 'max-autotune' captures its own CUDA graphs, which would be "
        "captured inside ours; allowed: default, max-autotune-no-cudagraphs, lite",
    ),
    (
        ["--piecewise-cuda-graph-compiler", "aot"],
        {"piecewise_cuda_graph_compiler": "aot"},
        "--piecewise-cuda-graph-compiler: unknown compiler 'aot'; allowed: eager, inductor",
    ),
    (
        ["--decode-cuda-graph-max-padding-ratio", "x"],
        {"decode_cuda_graph_max_padding_ratio": "x"},
        "--decode-cuda-graph-max-padding-ratio: 'x' is not a number; allowed: " + RATIO_ALLOWED,
    ),
    (
        ["--decode-cuda-graph-max-padding-ratio", "0.5"],
        {"decode_cuda_graph_max_padding_ratio": 0.5},
        "--decode-cuda-graph-max-padding-ratio: 0.5 is not allowed; allowed: " + RATIO_ALLOWED,
    ),
    (
        ["--prefill-cuda-graph-max-padding-ratio", "0"],
        {"prefill_cuda_graph_max_padding_ratio": 0},
        "--prefill-cuda-graph-max-padding-ratio: 0.0 is not allowed; allowed: " + RATIO_ALLOWED,
    ),
    (
        ["--prefill-cuda-graph-max-padding-ratio", "inf"],
        {"prefill_cuda_graph_max_padding_ratio": float("inf")},
        "--prefill-cuda-graph-max-padding-ratio: inf is not allowed; allowed: " + RATIO_ALLOWED,
    ),
    (
        ["--decode-cuda-graph-memory-budget", "120%"],
        {"decode_cuda_graph_memory_budget": "120%"},
        "--decode-cuda-graph-memory-budget: '120%' is not allowed; allowed: " + BUDGET_ALLOWED,
    ),
    (
        ["--prefill-cuda-graph-memory-budget", "0"],
        {"prefill_cuda_graph_memory_budget": 0},
        "--prefill-cuda-graph-memory-budget: '0' is not allowed; allowed: " + BUDGET_ALLOWED,
    ),
    (
        ["--prefill-cuda-graph-memory-budget", "2XB"],
        {"prefill_cuda_graph_memory_budget": "2XB"},
        "--prefill-cuda-graph-memory-budget: '2XB' is not allowed; allowed: " + BUDGET_ALLOWED,
    ),
    (
        ["--tc-piecewise-compile-cache-dir", ""],
        {"tc_piecewise_compile_cache_dir": ""},
        "--tc-piecewise-compile-cache-dir: '' is not allowed; allowed: a directory path (a non-empty string)",
    ),
    (
        ["--cuda-graph-mode", '{"decode": {"backend": "full", "max_padding": 1.5}}'],
        {"cuda_graph_mode": '{"decode": {"backend": "full", "max_padding": 1.5}}'},
        "--cuda-graph-mode: unknown key 'max_padding' in the decode object; allowed keys: backend, max_padding_ratio, "
        "memory_budget, capture_policy (closest: 'max_padding_ratio'); e.g. " + PHASE_OBJECT,
    ),
    (
        ["--cuda-graph-config", '{"prefill": {"budget": "2GiB"}}'],
        {"cuda_graph_config": '{"prefill": {"budget": "2GiB"}}'},
        "--cuda-graph-config: unknown key 'budget' in the prefill object; allowed keys: backend, max_padding_ratio, "
        "memory_budget, capture_policy (closest: 'memory_budget'); e.g. " + PHASE_OBJECT,
    ),
    (
        ["--cuda-graph-mode", '{"decode": {"max_padding_ratio": 0.9}}'],
        {"cuda_graph_mode": '{"decode": {"max_padding_ratio": 0.9}}'},
        "--cuda-graph-mode decode.max_padding_ratio: 0.9 is not allowed; allowed: " + RATIO_ALLOWED,
    ),
    (
        ["--cuda-graph-mode", '{"prefill": {"backend": "full", "memory_budget": "0MiB"}}'],
        {"cuda_graph_mode": '{"prefill": {"backend": "full", "memory_budget": "0MiB"}}'},
        "--cuda-graph-mode prefill.memory_budget: '0MiB' is not allowed; allowed: " + BUDGET_ALLOWED,
    ),
    (
        ["--cuda-graph-mode", '{"prefill": {"backend": "fulll"}}'],
        {"cuda_graph_mode": '{"prefill": {"backend": "fulll"}}'},
        "--cuda-graph-mode: unknown backend 'fulll' for prefill; allowed backends: full, breakable, tc_piecewise, "
        "disabled",
    ),
    (
        ["--cuda-graph-mode", '{"decode": {"backend": "full", "backend": "breakable"}}'],
        {"cuda_graph_mode": '{"decode": {"backend": "full", "backend": "breakable"}}'},
        "--cuda-graph-mode: key 'backend' is given twice; give each key at most once",
    ),
    (
        ["--enforce-piecewise-cuda-graph", "--prefill-disable-cuda-graph", "--cuda-graph-mode", '{"prefill": "x"}'],
        {
            "enforce_piecewise_cuda_graph": True,
            "prefill_disable_cuda_graph": True,
            "cuda_graph_mode": '{"prefill": "x"}',
        },
        "--cuda-graph-mode: unknown backend 'x' for prefill; allowed backends: full, breakable, tc_piecewise, disabled",
    ),
    # vLLM's spellings
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


@pytest.mark.parametrize(("argv", "keywords", "message"), CASES, ids=[case[2][:60] for case in CASES])
def test_error_message_is_exact_on_both_routes(argv: list[str], keywords: dict[str, object], message: str) -> None:
    with recorded_warnings() as caught:
        with pytest.raises(ConfigError) as from_flags:
            resolve_argv(argv)
        with pytest.raises(ConfigError) as from_keywords:
            resolve(**keywords)
    assert str(from_flags.value) == message
    assert str(from_keywords.value) == message
    assert "\n" not in message
    assert isinstance(from_flags.value, ValueError)
    assert caught == []


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"decode_cuda_graph_bs": []}, "--decode-cuda-graph-bs: empty list; allowed: one or more positive integers"),
        ({"decode_cuda_graph_bs": 8}, "--decode-cuda-graph-bs: expected a list of positive integers, got 8"),
        ({"decode_cuda_graph_bs": b"1 2"}, "--decode-cuda-graph-bs: expected a list of positive integers, got b'1 2'"),
        (
            {"decode_cuda_graph_bs": "1,,2"},
            "--decode-cuda-graph-bs: '1,,2' has an empty entry; "
            "allowed: positive integers separated by spaces or commas",
        ),
        (
            {"decode_cuda_graph_bs": [True]},
            "--decode-cuda-graph-bs: True is not an integer; allowed: positive integers",
        ),
        ({"decode_cuda_graph_bs": [2.0]}, "--decode-cuda-graph-bs: 2.0 is not an integer; allowed: positive integers"),
        ({"debug_cuda_graph": "yes"}, "--debug-cuda-graph: expected True or False, got 'yes'"),
        ({"disable_cuda_graph": 1}, "--disable-cuda-graph: expected True or False, got 1"),
        (
            {"cuda_graph_mode": 3},
            '--cuda-graph-mode: expected JSON text, got 3; e.g. {"decode": "full", "prefill": "breakable"}',
        ),
        (
            {"cuda_graph_mode": {"verify": "full"}},
            "--cuda-graph-mode: unknown phase 'verify'; allowed phases: decode, prefill",
        ),
        (
            {"cuda_graph_mode": {"decode": {1: "full"}}},
            "--cuda-graph-mode: unknown key 1 in the decode object; allowed keys: backend, max_padding_ratio, "
            "memory_budget, capture_policy (closest: 'memory_budget'); e.g. " + PHASE_OBJECT,
        ),
        (
            {"decode_cuda_graph_max_padding_ratio": True},
            "--decode-cuda-graph-max-padding-ratio: True is not a number; allowed: " + RATIO_ALLOWED,
        ),
        (
            {"decode_cuda_graph_memory_budget": [2]},
            '--decode-cuda-graph-memory-budget: [2] is not allowed; allowed: "1.5GiB", "512MiB", "2" (GiB) or "20%" '
            "(of the free memory at capture)",
        ),
        (
            {"tc_piecewise_compile_cache_dir": b"/cache"},
            "--tc-piecewise-compile-cache-dir: b'/cache' is not allowed; allowed: a directory path (a non-empty "
            "string)",
        ),
        # vLLM's spellings
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


def test_unknown_keyword_lists_the_allowed_ones() -> None:
    with pytest.raises(ConfigError) as error:
        resolve(decode_cuda_graph_batch_sizes=[1])
    message = str(error.value)
    assert message.startswith("unknown CUDA-graph setting 'decode_cuda_graph_batch_sizes'; allowed keyword arguments: ")
    assert "decode_cuda_graph_bs" in message and "piecewise_cuda_graph_compiler" in message


def test_unknown_key_in_a_mapping_namespace() -> None:
    with pytest.raises(ConfigError, match="unknown CUDA-graph setting 'model'"):
        resolve({"model": "x"})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"pipeline_parallel_size": 0}, "Environment.pipeline_parallel_size: 0 is not allowed; allowed: integers >= 1"),
        (
            {"pipeline_parallel_size": 1.5},
            "Environment.pipeline_parallel_size: 1.5 is not allowed; allowed: integers >= 1",
        ),
        ({"gpu_memory_gib": 0}, "Environment.gpu_memory_gib: 0 is not allowed; allowed: a positive number or None"),
        ({"device_type": ""}, "Environment.device_type: '' is not a device type; e.g. 'cuda', 'cpu'"),
    ],
)
def test_environment_errors(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        Environment(**fields)  # type: ignore[arg-type]
    assert str(error.value) == message


def test_environment_must_be_an_environment() -> None:
    with pytest.raises(
        ConfigError, match=r"^environment: expected a cudagraph.config.Environment, got \{'lora': True\}"
    ):
        resolve(environment={"lora": True})  # type: ignore[arg-type]
