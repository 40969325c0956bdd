"""Expert parallel by token exchange on two GPUs (NCCL): the tiny MoE model split over two ranks with
``moe_a2a_backend="all_to_all"`` gives the all-reduce path's tokens and logits eagerly, and its decode graphs (full,
breakable, tc_piecewise) give its eager tokens at every decode batch size 1..64; a full graph captures both
all-to-alls of every sparse block, and a breakable capture breaks at each of them.

Float32 models run the dense expert computation and must agree token for token (only the order of sums differs);
the bfloat16 model runs ``grouped_mm`` on the received rows, held to ``BF16_LOGITS`` against the all-reduce path.
Needs two CUDA devices (skipped with the reason otherwise); every process keeps NVLink multicast off (the launcher's
environment).
"""

from __future__ import annotations

import json

import pytest
import torch
import tp_gpu_workers as workers

from cudagraph.config import Backend
from cudagraph.engine import commands
from cudagraph.engine.distributed import launch
from cudagraph.engine.model import model_config_from_preset

needs_two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason=f"expert-parallel all-to-all GPU test: needs 2 CUDA devices, {torch.cuda.device_count()} visible",
)
pytestmark = [pytest.mark.gpu, needs_two_gpus]

PRESET = "tiny-qwen3-moe-random"
EXCHANGE = workers.EngineOptions(moe_a2a_backend="all_to_all")
FLOAT32_LOGITS = {"rtol": 1e-4, "atol": 1e-4}
BF16_LOGITS = {"rtol": 5e-2, "atol": 5e-2}


def sparse_layers(preset: str) -> int:
    config = model_config_from_preset(preset)
    return sum(config.uses_experts(layer) for layer in range(config.num_layers))


def test_tp2_all_to_all_eager_gives_the_all_reduce_paths_tokens_and_logits() -> None:
    reduced = launch(workers.tensor_parallel, (PRESET, "float32", "disabled", "auto"), 2)
    exchanged = launch(workers.tensor_parallel, (PRESET, "float32", "disabled", "auto", EXCHANGE), 2)
    assert exchanged["tokens"] == reduced["tokens"]
    for index, (have, want) in enumerate(zip(exchanged["logits"], reduced["logits"], strict=True)):
        torch.testing.assert_close(have, want, **FLOAT32_LOGITS, msg=lambda m, i=index: f"prompt {i}: {m}")


@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE, Backend.TC_PIECEWISE])
def test_tp2_all_to_all_graphs_give_tp2_all_to_all_eager_tokens_at_every_batch_size(backend: Backend) -> None:
    eager = launch(workers.tensor_parallel, (PRESET, "float32", "disabled", "auto", EXCHANGE), 2)
    graphed = launch(workers.tensor_parallel, (PRESET, "float32", str(backend), "auto", EXCHANGE), 2)
    assert graphed["replayed"] == list(range(1, 65)), "every decode batch size 1..64 should have replayed a graph"
    for index, (want, have) in enumerate(zip(eager["tokens"], graphed["tokens"], strict=True)):
        assert have == want, f"prompt {index} diverged"
    if backend is Backend.BREAKABLE:
        # Dispatch and combine: two all-to-all breaks per sparse block, in every captured bucket.
        expected = dict.fromkeys(workers.DECODE_BUCKETS, 2 * sparse_layers(PRESET))
        assert graphed["all_to_all_breaks"] == expected


def test_tp2_all_to_all_in_bfloat16_on_grouped_mm_stays_near_the_all_reduce_paths_logits() -> None:
    reduced = launch(workers.tensor_parallel, (PRESET, "bfloat16", "full", "auto"), 2)
    exchanged = launch(workers.tensor_parallel, (PRESET, "bfloat16", "full", "auto", EXCHANGE), 2)
    for index, (have, want) in enumerate(zip(exchanged["logits"], reduced["logits"], strict=True)):
        torch.testing.assert_close(have, want, **BF16_LOGITS, msg=lambda m, i=index: f"prompt {i}: {m}")


def test_cli_generate_at_tp2_with_all_to_all_gives_the_all_reduce_paths_tokens(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``generate --tp-size 2 --moe-a2a-backend all_to_all`` on CUDA (the group's all-to-all warmed before capture,
    default graphs) prints the tokens of ``--moe-a2a-backend none``."""
    base = ["generate", "--preset", PRESET, "--device", "cuda", "--dtype", "float32", "--tp-size", "2"]
    base += ["--prompt-token-ids", "5,6,7,8", "--prompt-token-ids", "1,2,3", "--max-new-tokens", "12", "--json", "-q"]
    assert commands.main([*base, "--moe-a2a-backend", "none"]) == 0
    reduced = json.loads(capsys.readouterr().out)
    assert commands.main([*base, "--all2all-backend", "all_to_all"]) == 0
    assert json.loads(capsys.readouterr().out)["outputs"] == reduced["outputs"]


LARGE_PRESET = "qwen3-30b-a3b-random"
"""Qwen3-30B-A3B's shapes: 48 layers, 128 experts of width 768, top-8 (15 GB of bfloat16 weights a rank at TP=2)."""


@pytest.mark.parametrize("exchange", ["none", "all_to_all"])
def test_tp2_qwen3_30b_a3b_shape_graphs_give_its_eager_tokens(exchange: str) -> None:
    """The 30B-A3B shape split over two GPUs in bfloat16 (``grouped_mm`` experts), the experts reached by the
    all-reduce of partial sums (``none``) or by the token exchange: every graph backend's greedy tokens equal the
    same shard's eager tokens at every decode batch size 1..64."""
    options = workers.EngineOptions(moe_a2a_backend=exchange)
    backends = (str(Backend.FULL), str(Backend.BREAKABLE), str(Backend.TC_PIECEWISE))
    runs = launch(workers.eager_and_graphed, (LARGE_PRESET, "bfloat16", backends, options), 2, exit_timeout_s=180.0)
    workers.assert_graphs_give_eager_tokens(runs, backends)
