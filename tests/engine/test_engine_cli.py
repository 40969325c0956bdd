"""The ``cudagraph-engine`` command line on the CPU: the scripted JSON interface, model directories, errors."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from cudagraph.engine.commands import main, token_ids
from cudagraph.engine.model import model_config_from_preset, random_model, reference_greedy, save_model
from cudagraph.engine.model_runner import ModelRunner

PROMPTS = [[1, 2, 3], [7, 300, 9, 11, 4], [42]]


def prompt_args(prompts: list[list[int]]) -> list[str]:
    return [arg for prompt in prompts for arg in ("--prompt-token-ids", ",".join(map(str, prompt)))]


def test_python_dash_m_prints_the_scripted_json_and_says_why_graphs_are_off() -> None:
    command = [sys.executable, "-m", "cudagraph.engine", "generate", "--preset", "tiny-qwen3-random"]
    command += [*prompt_args(PROMPTS), "--max-new-tokens", "5", "--json", "--device", "cpu"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    model = random_model(model_config_from_preset("tiny-qwen3-random"), seed=0, device="cpu")
    assert payload["outputs"] == [{"output_token_ids": reference_greedy(model, p, 5)} for p in PROMPTS]
    assert payload["speed"]["generated_tokens"] == 15  # the rest of the speed: test_engine_cli_speed.py
    assert "CUDA graphs need a CUDA device" in result.stderr
    assert "INFO cudagraph.engine: speed: 9 prompt tokens, 15 generated in " in result.stderr


def test_a_cpu_run_says_once_at_info_why_graphs_are_off(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    # One INFO line (so -q silences it) naming the rule and both phases; the model runner only repeats it at DEBUG.
    argv = ["generate", "--preset", "tiny-qwen3-random", "--prompt-token-ids", "1,2", "--max-new-tokens", "1"]
    with caplog.at_level(logging.DEBUG):
        assert main([*argv, "--device", "cpu"]) == 0
    lines = [
        record
        for record in caplog.records
        if "graphs" in record.getMessage() and record.levelno > logging.DEBUG and record.name == "cudagraph.config"
    ]
    assert [(record.name, record.levelno) for record in lines] == [("cudagraph.config", logging.INFO)]
    assert lines[0].getMessage().startswith("decode and prefill CUDA graphs off (")
    assert (
        "by rule non_cuda_device: CUDA graphs need a CUDA device, and the device type is 'cpu'" in lines[0].getMessage()
    )


def test_model_directory_in_its_own_dtype(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = random_model(model_config_from_preset("tiny-llama-random"), seed=4, device="cpu")
    save_model(model, tmp_path / "llama")
    argv = ["generate", "--model", str(tmp_path / "llama"), *prompt_args(PROMPTS[:2]), "--max-new-tokens", "3"]
    assert main([*argv, "--json", "--device", "cpu"]) == 0
    outputs = json.loads(capsys.readouterr().out)["outputs"]
    assert [o["output_token_ids"] for o in outputs] == [reference_greedy(model, p, 3) for p in PROMPTS[:2]]
    # Without --json: one human-readable line per prompt.
    assert main([*argv, "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"prompt {i}: {o['output_token_ids']}" for i, o in enumerate(outputs)]


def test_temperature_and_dtype_flags(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--preset", "tiny-qwen3-random", *prompt_args(PROMPTS), "--max-new-tokens", "6", "--json"]
    argv += ["--device", "cpu", "--temperature", "3.0", "--seed", "5", "--dtype", "bfloat16"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["outputs"] == first["outputs"]  # "speed" holds times: not equal
    assert [len(o["output_token_ids"]) for o in first["outputs"]] == [6, 6, 6]


def test_the_graph_memory_estimate_is_made_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--estimate-cuda-graph-memory`` reaches the model runner; without it the start makes no probe captures."""
    asked: list[bool] = []
    monkeypatch.setattr(ModelRunner, "init_cuda_graphs", lambda self: asked.append(self.log_capture_estimate))
    argv = ["generate", "--preset", "tiny-qwen3-random", *prompt_args(PROMPTS[:1]), "--max-new-tokens", "2"]
    assert main([*argv, "--json", "--device", "cpu"]) == 0
    plain = json.loads(capsys.readouterr().out)["outputs"]
    assert main([*argv, "--json", "--device", "cpu", "--estimate-cuda-graph-memory"]) == 0
    assert json.loads(capsys.readouterr().out)["outputs"] == plain
    assert asked == [False, True]


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ("1,x,3", "item 2 of 3 'x' is not an integer"),
        ("", "the only item is empty"),
        ("-1", "the only item -1 is negative"),
        ("1,2,-5", "item 3 of 3 -5 is negative"),
        ("1,,2", "item 2 of 3 is empty"),
        ("1,2,", "item 3 of 3 is empty"),
        (",1", "item 1 of 2 is empty"),
        ("1, ,2", "item 2 of 3 is empty"),
        ("1.5", "the only item '1.5' is not an integer"),
    ],
)
def test_bad_prompt_token_ids_name_the_bad_item(bad: str, problem: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["generate", "--preset", "tiny-qwen3-random", "--prompt-token-ids", bad, "--device", "cpu"])
    assert exited.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"cudagraph-engine generate: error: argument --prompt-token-ids: {bad!r}: {problem}; allowed: non-negative "
        "integers separated by commas, e.g. 1,2,3 (see cudagraph-engine generate --help)"
    ]


def test_token_ids_take_spaces_around_items() -> None:
    assert token_ids(" 1, 2 ,3") == [1, 2, 3]
    assert token_ids("0") == [0]


@pytest.mark.parametrize("rest", [[], ["--preset", "tiny-llama-random", "--batch-sizes", "1"], ["--help"]])
def test_bench_moved_to_the_harness_is_one_line_saying_what_to_run(
    rest: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *rest]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "cudagraph-engine bench: error: decode-step timing moved to the benchmark harness, which lives in a source "
        "checkout of cudagraph: run `nox -s bench` (or `python3 bench/run.py`; `python3 bench/bench_engine.py` for "
        "the engine's decode steps)\n"
    )


def test_page_size_16_generates_the_reference_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--preset", "tiny-qwen3-random", *prompt_args(PROMPTS), "--max-new-tokens", "4"]
    assert main([*argv, "--json", "--device", "cpu", "--page-size", "16", "--max-num-reqs", "2"]) == 0
    model = random_model(model_config_from_preset("tiny-qwen3-random"), seed=0, device="cpu")
    outputs = json.loads(capsys.readouterr().out)["outputs"]
    assert outputs == [{"output_token_ids": reference_greedy(model, p, 4)} for p in PROMPTS]
