"""``generate --json``'s ``"speed"`` on a GPU: the graphs' capture time and memory, and steps that replayed."""

from __future__ import annotations

import json

import pytest

from cudagraph.engine.commands import main


@pytest.mark.gpu
def test_generate_reports_replayed_steps_capture_time_and_graph_memory(capsys: pytest.CaptureFixture[str]) -> None:
    # One prompt and 8 new tokens: one prefill step and 7 decode steps of one request, which replay decode's
    # bucket-1 graph (the prefill step replays or runs eagerly, by its token count's bucket).
    argv = ["generate", "--preset", "tiny-llama-random", "--device", "cuda", "--prompt-token-ids", "1,2,3"]
    assert main([*argv, "--max-new-tokens", "8", "--json", "-q"]) == 0
    speed = json.loads(capsys.readouterr().out)["speed"]
    assert speed["prompt_tokens"] == 3 and speed["generated_tokens"] == 8
    assert speed["steps_replayed"] + speed["steps_eager"] == 8
    assert speed["steps_replayed"] >= 7
    assert speed["capture_s"] > 0
    # The capture's bytes are the device's free memory before and after, which another process on the device moves
    # (tests/gpu/bench/test_bench_harness_gpu.py says how): a count, not asserted above 0 here.
    assert isinstance(speed["graph_memory_bytes"], int) and speed["graph_memory_bytes"] >= 0
    assert speed["decode_tokens_per_s"] > 0 and 0 < speed["time_to_first_token_s"] < speed["total_s"]
