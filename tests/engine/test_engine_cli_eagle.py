"""``cudagraph-engine generate --speculative-tokens K --speculative-draft eagle:DIR|PRESET`` on the CPU: the tokens
plain greedy decoding gives with a random head, a self-draft head (every draft accepted) and a head loaded from a
directory, and one error for a value that names no head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudagraph.engine.commands import main
from cudagraph.engine.model import model_config_from_preset, random_model, reference_greedy, save_model
from cudagraph.engine.model.eagle import random_eagle_head, save_eagle_head

PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [7, 300, 9, 11, 4], [42]]
PRESET = "tiny-qwen3-random"
GENERATE = ["generate", "--device", "cpu", "--max-new-tokens", "9", "--json"]


def prompt_args() -> list[str]:
    return [arg for prompt in PROMPTS for arg in ("--prompt-token-ids", ",".join(map(str, prompt)))]


@pytest.fixture(scope="module")
def one_layer_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-layer target saved as a model directory (the self-draft head copies it)."""
    path = tmp_path_factory.mktemp("one-layer")
    save_model(random_model(model_config_from_preset(PRESET).with_overrides(num_layers=1), seed=0), path)
    return path


def run(model: list[str], draft: str, k: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple:
    metrics_path = tmp_path / "metrics.json"
    argv = [*GENERATE, *model, *prompt_args(), "--speculative-tokens", str(k), "--speculative-draft", draft]
    assert main([*argv, "--cuda-graph-metrics", str(metrics_path)]) == 0
    outputs = json.loads(capsys.readouterr().out)["outputs"]
    return [output["output_token_ids"] for output in outputs], json.loads(metrics_path.read_text())


def test_a_random_head_gives_the_greedy_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokens, metrics = run(["--preset", PRESET], "eagle:random", 3, tmp_path, capsys)
    model = random_model(model_config_from_preset(PRESET), seed=0)
    assert tokens == [reference_greedy(model, prompt, 9) for prompt in PROMPTS]
    assert metrics["verify"]["steps"] > 0 and metrics["decode"]["steps"] == 0
    # The head's steps have tables of their own: a chain and a draft extend a verify step (eager on the CPU); the
    # extend is skipped after the last verify step of the longest request, which then finished.
    assert metrics["draft"]["steps"] == metrics["verify"]["steps"]
    assert 0 < metrics["draft extend"]["steps"] < metrics["verify"]["steps"]


def test_the_self_draft_head_gives_the_greedy_tokens_k_plus_one_a_step(
    one_layer_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokens, metrics = run(["--model", str(one_layer_model)], "eagle:self", 3, tmp_path, capsys)
    model = random_model(model_config_from_preset(PRESET).with_overrides(num_layers=1), seed=0)
    assert tokens == [reference_greedy(model, prompt, 9) for prompt in PROMPTS]
    assert metrics["verify"]["steps"] == 2  # 8 tokens after the prefill's, 4 a verify step: every draft accepted


def test_a_head_directory_drafts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = random_model(model_config_from_preset(PRESET), seed=0)
    save_eagle_head(random_eagle_head(model, seed=7), tmp_path / "head")
    tokens, _ = run(["--preset", PRESET], f"eagle:{tmp_path / 'head'}", 2, tmp_path, capsys)
    assert tokens == [reference_greedy(model, prompt, 9) for prompt in PROMPTS]


@pytest.mark.parametrize(
    ("draft", "message"),
    [
        ("eagle:", "not an EAGLE preset nor a directory holding config.json and model.safetensors; allowed: "),
        ("eagle:./nowhere", "allowed: eagle:PRESET (random, self) or eagle:DIR"),
        ("eagle:self", "the self-draft head copies a one-layer target; this target has 2 layers"),
    ],
)
def test_a_draft_that_names_no_usable_head_is_one_error(
    draft: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*GENERATE, "--preset", PRESET, *prompt_args(), "--speculative-tokens", "2", "--speculative-draft", draft]
    assert main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and message in error[0]
