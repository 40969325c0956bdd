"""``cudagraph-engine generate --cuda-graph-metrics`` on the CPU: graphs are off, so every step is counted eager under
that reason; stdout stays the scripted JSON, the table goes to stderr and the JSON to the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudagraph.engine.commands import DEFAULT_METRICS_PATH, main
from cudagraph.runner import EagerReason

PROMPTS = [[1, 2, 3], [7, 300, 9, 11, 4], [42]]
NEW_TOKENS = 5


def generate_args(*extra: str) -> list[str]:
    argv = ["generate", "--preset", "tiny-qwen3-random", "--device", "cpu", "--max-new-tokens", str(NEW_TOKENS)]
    for prompt in PROMPTS:
        argv += ["--prompt-token-ids", ",".join(map(str, prompt))]
    return [*argv, *extra]


def test_metrics_count_every_step_under_its_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(generate_args("--json")) == 0
    plain = json.loads(capsys.readouterr().out)
    path = tmp_path / "out" / "metrics.json"
    assert main(generate_args("--json", "--cuda-graph-metrics", str(path))) == 0
    captured = capsys.readouterr()
    # --cuda-graph-metrics leaves the scripted stdout alone: the same keys and outputs ("speed" holds times)
    scripted = json.loads(captured.out)
    assert set(scripted) == set(plain) and scripted["outputs"] == plain["outputs"]
    metrics = json.loads(path.read_text())
    # All prompts fit one prefill step (each request's first token); every further token is one decode step.
    prefill, decode = metrics["prefill"], metrics["decode"]
    assert (prefill["steps"], prefill["replays"]) == (1, 0)
    assert prefill["eager_reasons"] == [
        {
            "reason": EagerReason.GRAPHS_UNAVAILABLE.value,
            "text": EagerReason.GRAPHS_UNAVAILABLE.text,
            "steps": 1,
            "tokens": sum(map(len, PROMPTS)),
            "hint": None,
        }
    ]
    assert (decode["steps"], decode["replays"]) == (NEW_TOKENS - 1, 0)
    [decode_reason] = decode["eager_reasons"]
    assert decode_reason["reason"] == EagerReason.GRAPHS_UNAVAILABLE.value
    assert decode_reason["tokens"] == (NEW_TOKENS - 1) * len(PROMPTS)
    assert f"decode CUDA graphs: steps {NEW_TOKENS - 1}, replayed 0, eager {NEW_TOKENS - 1}" in captured.err
    assert "prefill CUDA graphs: steps 1, replayed 0, eager 1" in captured.err


def test_metrics_without_a_path_go_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    # The flag takes an optional path: one followed by another option writes to the default file.
    assert main(generate_args("--cuda-graph-metrics", "--json")) == 0
    outputs = json.loads(capsys.readouterr().out)["outputs"]
    assert len(outputs) == len(PROMPTS)
    written = json.loads((tmp_path / DEFAULT_METRICS_PATH).read_text())
    assert sorted(written) == ["decode", "prefill"]
    assert written["decode"]["steps"] + written["prefill"]["steps"] == NEW_TOKENS
