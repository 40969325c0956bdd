"""``generate --lora-modules`` on a GPU: both phases' LoRA variants are captured, the steps of prompts through an
adapter replay them (the plain variants take none), and the tokens equal the same command's with graphs off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lora_factors import random_lora_adapter

from cudagraph.engine.commands import main
from cudagraph.engine.lora import LoraAdapter
from cudagraph.engine.model import model_config_from_preset

pytestmark = pytest.mark.gpu

PRESET = "tiny-llama-random"
NEW_TOKENS = 8


def _adapter(rank: int, seed: int) -> LoraAdapter:
    return random_lora_adapter(model_config_from_preset(PRESET), rank, torch.Generator().manual_seed(seed))


def _generate(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    base = ["generate", "--preset", PRESET, "--dtype", "float32", "--device", "cuda", "--json", "-q"]
    prompts = ["--prompt-token-ids", "5,9,2,7", "--prompt-token-ids", "11,3,8"]
    assert main([*base, *prompts, "--max-new-tokens", str(NEW_TOKENS), *argv]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_prompts_through_adapters_replay_the_lora_variants(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sql = _adapter(rank=4, seed=1).save_peft(tmp_path / "sql")
    chat = _adapter(rank=8, seed=2).save_peft(tmp_path / "chat")
    lora = ["--lora-modules", f"sql={sql}", "--lora-paths", f"chat={chat}", "--lora-name", "sql", "--lora-name", "chat"]
    graphed = _generate(lora, capsys)
    eager = _generate([*lora, "--disable-cuda-graph"], capsys)
    assert graphed["outputs"] == eager["outputs"]
    rows = {(row["phase"], row["variant"]): row for row in graphed["graph_variants"]}  # type: ignore[union-attr]
    assert set(rows) == {("decode", "plain"), ("decode", "lora"), ("prefill", "plain"), ("prefill", "lora")}
    assert all(row["graphed"] for row in rows.values())
    assert rows[("decode", "lora")]["max_rank"] == 8
    # Both prompts share every step: NEW_TOKENS - 1 decode steps of two requests, all on bucket 2 of the LoRA variant.
    assert (rows[("decode", "lora")]["replayed"], rows[("decode", "lora")]["eager"]) == (NEW_TOKENS - 1, 0)
    assert rows[("prefill", "lora")]["replayed"] + rows[("prefill", "lora")]["eager"] == 1
    assert rows[("decode", "plain")]["replayed"] == rows[("decode", "plain")]["eager"] == 0
    speed = graphed["speed"]
    assert isinstance(speed, dict) and speed["steps_replayed"] >= NEW_TOKENS - 1 and speed["capture_s"] > 0
