"""Tensor parallel on eight GPUs: TP=8 graphs (full, breakable, tc_piecewise) give TP=8 eager's greedy tokens at
every decode batch size 1..64 (batch 1, 8 and 64 among them), on a tiny float32 model with eight query and KV heads
(one of each a rank) and on the Llama-3-8B shape in bfloat16 (32 heads, 8 KV heads: four and one a rank).

Needs eight CUDA devices (skipped with the reason otherwise). Every process keeps NVLink multicast off (the
launcher's environment). Each run builds its sharded model once and runs eagerly, then under each backend.
"""

from __future__ import annotations

import pytest
import torch
import tp_gpu_workers as workers

from cudagraph.config import Backend
from cudagraph.engine.distributed import launch

needs_eight_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 8,
    reason=f"TP=8 GPU test: needs 8 CUDA devices, {torch.cuda.device_count()} visible",
)
pytestmark = [pytest.mark.gpu, needs_eight_gpus]

BACKENDS = (str(Backend.FULL), str(Backend.BREAKABLE), str(Backend.TC_PIECEWISE))
EIGHT_HEADS = workers.EngineOptions(heads=(8, 8))


@pytest.mark.parametrize(
    ("preset", "dtype", "options"),
    [("tiny-qwen3-random", "float32", EIGHT_HEADS), ("llama3-8b-random", "bfloat16", workers.DEFAULT_OPTIONS)],
    ids=["tiny-8-heads", "llama-3-8b"],
)
def test_tp8_graphs_give_tp8_eager_tokens_at_every_batch_size(
    preset: str, dtype: str, options: workers.EngineOptions
) -> None:
    runs = launch(workers.eager_and_graphed, (preset, dtype, BACKENDS, options), 8, exit_timeout_s=180.0)
    workers.assert_graphs_give_eager_tokens(runs, BACKENDS)
