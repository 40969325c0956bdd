"""Bad input to ``cudagraph-engine`` is one line on stderr naming the problem, exit 2, never a traceback."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from cudagraph.engine.commands import EXIT_USAGE, main
from cudagraph.engine.model import model_config_from_preset, random_model, save_model

GENERATE = ["generate", "--prompt-token-ids", "1,2,3", "--max-new-tokens", "2", "--device", "cpu"]


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("models") / "tiny"
    save_model(random_model(model_config_from_preset("tiny-qwen3-random"), seed=0, device="cpu"), directory)
    return directory


def _copy(source: Path, target: Path, edit: Callable[[Path], None]) -> Path:
    target.mkdir()
    for file in source.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    edit(target)
    return target


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse's own usage errors
        status = int(exit_.code or 0)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == EXIT_USAGE, err
    assert "Traceback" not in err
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason=(
        "checks the error of a machine without CUDA, and this one has CUDA: `nox -s tests` on a CPU machine runs it"
    ),
)
def test_cuda_asked_for_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error(
        ["generate", "--preset", "tiny-qwen3-random", "--prompt-token-ids", "1", "--device", "cuda"], capsys
    )
    assert "--device cuda: CUDA is not available here" in line and "use --device cpu" in line


@pytest.mark.skipif(
    importlib.util.find_spec("flashinfer") is not None,
    reason=("checks the error without flashinfer, which is installed here: `nox -s tests` (a venv without it) runs it"),
)
def test_flashinfer_asked_for_and_not_installed_names_the_extra(capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error([*GENERATE, "--preset", "tiny-qwen3-random", "--attention-backend", "flashinfer"], capsys)
    assert "pip install 'cudagraph-engine[flashinfer]'" in line


def test_flashinfer_kernels_asked_for_and_not_installed_name_the_extra(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Absent, whether or not this machine has it (and the fused kernel module imported afresh).
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    monkeypatch.setitem(sys.modules, "cudagraph.engine.kernels.flashinfer.layer_set", None)
    monkeypatch.delitem(sys.modules, "cudagraph.engine.kernels.flashinfer.layer_set")
    line = _one_line_error([*GENERATE, "--preset", "tiny-qwen3-random", "--kernel-backend", "flashinfer"], capsys)
    assert "pip install 'cudagraph-engine[flashinfer]'" in line and "--kernel-backend torch" in line


def test_unknown_kernel_backend_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error([*GENERATE, "--preset", "tiny-qwen3-random", "--kernel-backend", "cutlass"], capsys)
    assert "--kernel-backend" in line and "'auto', 'torch', 'flashinfer', 'triton'" in line


def test_missing_model_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error([*GENERATE, "--model", str(tmp_path / "nowhere")], capsys)
    assert "nowhere" in line and "config.json" in line


def test_incomplete_model_directory(saved_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def drop_weights(directory: Path) -> None:
        for file in directory.glob("*.safetensors"):
            file.unlink()

    line = _one_line_error([*GENERATE, "--model", str(_copy(saved_model, tmp_path / "m", drop_weights))], capsys)
    assert "no weights in" in line and "model.safetensors" in line


def test_unsupported_config_names_the_field(
    saved_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def gelu(directory: Path) -> None:
        config = json.loads((directory / "config.json").read_text())
        config["hidden_act"] = "gelu"
        (directory / "config.json").write_text(json.dumps(config))

    line = _one_line_error([*GENERATE, "--model", str(_copy(saved_model, tmp_path / "m", gelu))], capsys)
    assert "hidden_act 'gelu' is not supported" in line


def test_truncated_safetensors(saved_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def truncate(directory: Path) -> None:
        for file in directory.glob("*.safetensors"):
            file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])

    line = _one_line_error([*GENERATE, "--model", str(_copy(saved_model, tmp_path / "m", truncate))], capsys)
    assert "model.safetensors" in line and "truncated or corrupt" in line


def test_prompt_longer_than_the_kv_cache(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--preset", "tiny-qwen3-random", "--device", "cpu", "--max-context-len", "8"]
    line = _one_line_error([*argv, "--prompt-token-ids", "1,2,3,4,5,6", "--max-new-tokens", "4"], capsys)
    assert "prompt 0 has 6 tokens and asks for 4 more, 10 in all" in line and "--max-context-len" in line


def test_bad_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error([*GENERATE, "--preset", "tiny-qwen3-random", "--dtype", "float8"], capsys)
    assert "--dtype" in line and "float8" in line and "bfloat16" in line


def test_debug_shows_the_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # in this process: `python -m cudagraph.engine` calls this main (test_engine_cli.py runs it so)
    assert main([*GENERATE, "--model", str(tmp_path / "nowhere"), "--debug"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" in err and err.rstrip().splitlines()[-1].startswith("cudagraph-engine")


@pytest.mark.parametrize("page_size", ["3", "256", "x"])
def test_page_size_not_a_power_of_two_up_to_128(page_size: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error([*GENERATE, "--preset", "tiny-qwen3-random", "--page-size", page_size], capsys)
    assert f"--page-size: {page_size!r} is not a power of two up to 128" in line


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_compile_mode_with_its_own_cuda_graphs_is_refused(mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*GENERATE, "--preset", "tiny-llama-random", "--torch-compile-max-bs", "8"]
    line = _one_line_error([*argv, "--torch-compile-mode", mode], capsys)
    assert line == (
        f"cudagraph-engine generate: error: --torch-compile-mode: torch.compile mode {mode!r} captures its own CUDA "
        "graphs, which would be captured inside ours; allowed: default, max-autotune-no-cudagraphs, lite"
    )


@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_max_new_tokens_must_be_positive(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--preset", "tiny-qwen3-random", "--device", "cpu", "--prompt-token-ids", "1,2,3"]
    line = _one_line_error([*argv, "--max-new-tokens", value], capsys)
    assert f"--max-new-tokens: {value!r} is not a positive integer; allowed: 1, 2, 3, ..." in line


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_temperature_must_be_zero_or_positive(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error([*GENERATE, "--preset", "tiny-qwen3-random", "--temperature", value], capsys)
    assert f"--temperature: {value!r} is not a temperature; allowed: 0 (greedy) or a positive number" in line


def test_prompt_token_id_outside_the_vocabulary(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--preset", "tiny-qwen3-random", "--device", "cpu", "--max-new-tokens", "2"]
    line = _one_line_error([*argv, "--prompt-token-ids", "1,2", "--prompt-token-ids", "3,512,4"], capsys)
    assert line == (
        "cudagraph-engine generate: error: prompt 1 has token id 512, outside the model's vocabulary of 512 tokens; "
        "allowed token ids: 0 to 511"
    )


def _positions_512(directory: Path) -> None:
    config = json.loads((directory / "config.json").read_text())
    config["max_position_embeddings"] = 512
    (directory / "config.json").write_text(json.dumps(config))


def _positions(count: int) -> Callable[[Path], None]:
    def edit(directory: Path) -> None:
        config = json.loads((directory / "config.json").read_text())
        config["max_position_embeddings"] = count
        (directory / "config.json").write_text(json.dumps(config))

    return edit


def test_kv_cache_longer_than_the_model_positions_is_refused_at_load(saved_model: Path, tmp_path: Path) -> None:
    # An explicit --max-context-len past a 512-position model: refused before any weight is read, and in a fresh
    # process, so nothing else (a rule's log line) reaches stderr first.
    model = _copy(saved_model, tmp_path / "m", _positions_512)
    command = [sys.executable, "-m", "cudagraph.engine", *GENERATE, "--model", str(model), "--max-context-len", "1024"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == EXIT_USAGE
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        "cudagraph-engine generate: error: --max-context-len 1024 exceeds the model's max_position_embeddings 512; "
        "allowed: --max-context-len 512 or less"
    ]


def test_the_default_kv_cache_length_comes_from_the_model_positions(
    saved_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A 256-position model and no --max-context-len: the cache takes the model's 256 rows, not 1024, and generates.
    model = _copy(saved_model, tmp_path / "m", _positions(256))
    argv = ["generate", "--model", str(model), "--device", "cpu", "--prompt-token-ids", "11,42,7"]
    assert main([*argv, "--max-new-tokens", "12", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["outputs"][0]["output_token_ids"]) == 12


def test_the_default_kv_cache_length_is_at_most_1024(
    saved_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A 4096-position model: the default stays 1024, so a prompt needing 1025 rows is told to raise the flag.
    model = _copy(saved_model, tmp_path / "m", _positions(4096))
    prompt = ",".join(["5"] * 1023)
    line = _one_line_error([*GENERATE, "--model", str(model), "--prompt-token-ids", prompt], capsys)
    assert line == (
        "cudagraph-engine generate: error: prompt 1 has 1023 tokens and asks for 2 more, 1025 in all, but the KV "
        "cache holds 1024 per request: raise --max-context-len (up to 4096, the model's positions) or shorten it"
    )


@pytest.mark.parametrize("explicit", [[], ["--max-context-len", "256"]], ids=["default", "explicit"])
def test_a_prompt_past_the_model_positions_is_not_told_to_raise_the_limit(
    explicit: list[str], saved_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _copy(saved_model, tmp_path / "m", _positions(256))
    argv = ["generate", "--model", str(model), "--device", "cpu", "--prompt-token-ids", ",".join(["5"] * 250)]
    line = _one_line_error([*argv, "--max-new-tokens", "12", *explicit], capsys)
    assert line == (
        "cudagraph-engine generate: error: prompt 0 has 250 tokens and asks for 12 more, 262 in all, but the model "
        "has 256 positions (max_position_embeddings), the most a request can hold: shorten the prompt or lower "
        "--max-new-tokens"
    )


def test_kv_cache_within_the_model_positions_generates(
    saved_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _copy(saved_model, tmp_path / "m", _positions_512)
    assert main([*GENERATE, "--model", str(model), "--max-context-len", "512", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["outputs"][0]["output_token_ids"]) == 2


def test_the_kv_cache_is_checked_against_the_model_positions(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*GENERATE, "--preset", "tiny-llama-random", "--max-context-len", "4097"]
    line = _one_line_error(argv, capsys)
    assert "--max-context-len 4097 exceeds the model's max_position_embeddings 4096" in line
