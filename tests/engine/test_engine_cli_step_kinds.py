"""``cudagraph-engine generate --speculative-tokens K [--speculative-draft SOURCE]`` and ``--mixed-steps`` on the CPU:
the tokens plain greedy decoding gives, and one error for a flag they cannot go with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudagraph.engine.commands import main
from cudagraph.engine.model import model_config_from_preset, random_model, reference_greedy

PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [7, 300, 9, 11, 4], [42]]
BASE = ["generate", "--preset", "tiny-qwen3-random", "--device", "cpu", "--max-new-tokens", "9", "--json"]


def prompt_args() -> list[str]:
    return [arg for prompt in PROMPTS for arg in ("--prompt-token-ids", ",".join(map(str, prompt)))]


@pytest.mark.parametrize(
    "step_kind",
    [
        ["--speculative-tokens", "1"],
        ["--speculative-tokens", "3", "--speculative-draft", "ngram"],
        ["--speculative-tokens", "2", "--speculative-draft", "tiny-qwen3-random"],  # the target's own weights
        ["--speculative-tokens", "2", "--speculative-draft", "tiny-llama-random"],
        ["--mixed-steps"],
    ],
    ids=["ngram-1", "ngram-3", "draft-same", "draft-other", "mixed"],
)
def test_step_kinds_give_the_greedy_tokens(
    step_kind: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics_path = tmp_path / "metrics.json"
    assert main([*BASE, *prompt_args(), *step_kind, "--cuda-graph-metrics", str(metrics_path)]) == 0
    outputs = json.loads(capsys.readouterr().out)["outputs"]
    model = random_model(model_config_from_preset("tiny-qwen3-random"), seed=0, device="cpu")
    assert [output["output_token_ids"] for output in outputs] == [reference_greedy(model, p, 9) for p in PROMPTS]
    metrics = json.loads(metrics_path.read_text())
    if "--speculative-tokens" in step_kind:
        # Verify steps ran instead of decode steps (eagerly on the CPU), at most one per token after the first.
        assert 0 < metrics["verify"]["steps"] <= 8 and metrics["decode"]["steps"] == 0
        if "tiny-qwen3-random" in step_kind:  # the target's own weights: every draft right, k + 1 tokens a step
            assert metrics["verify"]["steps"] == 3
    else:
        assert "verify" not in metrics and metrics["decode"]["steps"] == 8


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--speculative-tokens", "2", "--temperature", "0.5"], "--speculative-tokens verifies drafts greedily"),
        (["--speculative-tokens", "2", "--mixed-steps"], "not allowed with argument --speculative-tokens"),
        (["--speculative-tokens", "0"], "--speculative-tokens"),
        (["--speculative-draft", "ngram"], "add --speculative-tokens K"),
        (["--speculative-tokens", "2", "--speculative-draft", "./nowhere"], "not 'ngram', a preset ("),
        (
            ["--speculative-tokens", "2", "--speculative-draft", "qwen3-0.6b-random"],
            "must share the target's tokenizer",
        ),
    ],
)
def test_a_step_kind_with_a_flag_it_cannot_go_with_is_one_error(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main([*BASE, *prompt_args(), *extra])
    except SystemExit as exit_info:  # argparse's own usage errors exit; the engine's input errors return 2
        code = exit_info.code
    assert code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and message in error[0]
