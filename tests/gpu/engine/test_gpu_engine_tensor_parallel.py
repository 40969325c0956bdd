"""Tensor parallel on two GPUs: TP=2 graphs against TP=2 eager at every decode batch size 1..64, TP=2 against
TP=1, the all-reduce choice, and ranks that exit.

Needs at least two CUDA devices (skipped with the reason otherwise). Every process keeps NVLink multicast off (the
launcher sets ``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1``).

Tolerances: float32 models must give TP=1's greedy tokens exactly (only the order of partial sums differs);
bfloat16 logits of TP=2 against TP=1 must agree within ``BF16_LOGITS`` (each all-reduce rounds the partial sums to
bfloat16 once, where TP=1 accumulates in one matmul).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import tp_gpu_workers as workers

from cudagraph.config import Backend
from cudagraph.engine.distributed import launch

BF16_LOGITS = {"rtol": 5e-2, "atol": 5e-2}

needs_two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason=f"tensor-parallel GPU test: needs 2 CUDA devices, {torch.cuda.device_count()} visible; run `nox -s gpu` on "
    "a machine with two GPUs",
)
pytestmark = [pytest.mark.gpu, needs_two_gpus]

PRESETS = ("tiny-qwen3-random", "tiny-llama-random")


@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE])
@pytest.mark.parametrize("preset", PRESETS)
def test_tp2_graphs_give_tp2_eager_tokens_at_every_batch_size(preset: str, backend: Backend) -> None:
    eager = launch(workers.tensor_parallel, (preset, "float32", "disabled", "auto"), 2)
    graphed = launch(workers.tensor_parallel, (preset, "float32", str(backend), "auto"), 2)
    assert graphed["replayed"] == list(range(1, 65)), "every decode batch size 1..64 should have replayed a graph"
    for index, (want, have) in enumerate(zip(eager["tokens"], graphed["tokens"], strict=True)):
        assert have == want, f"prompt {index} diverged"


@pytest.mark.parametrize("preset", PRESETS)
def test_tp2_gives_tp1_tokens_in_float32_with_full_graphs(preset: str) -> None:
    single = workers.single_gpu(preset, "float32", Backend.FULL)
    sharded = launch(workers.tensor_parallel, (preset, "float32", "full", "auto"), 2)
    assert sharded["tokens"] == single["tokens"]
    for have, want in zip(sharded["logits"], single["logits"], strict=True):
        torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("preset", PRESETS)
def test_tp2_logits_match_tp1_within_bf16(preset: str) -> None:
    single = workers.single_gpu(preset, "bfloat16", Backend.FULL)
    sharded = launch(workers.tensor_parallel, (preset, "bfloat16", "full", "auto"), 2)
    for have, want in zip(sharded["logits"], single["logits"], strict=True):
        torch.testing.assert_close(have, want, **BF16_LOGITS)


needs_flashinfer = pytest.mark.skipif(
    importlib.util.find_spec("flashinfer") is None,
    reason="flashinfer is not installed: pip install flashinfer-python into the GPU interpreter (or put its wheels in "
    ".whl/, which `nox -s gpu` unpacks)",
)


@needs_flashinfer
@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE])
@pytest.mark.parametrize("preset", PRESETS)
def test_tp2_fused_kernels_over_paged_flashinfer_graphs_give_tp2_eager_tokens(preset: str, backend: Backend) -> None:
    """FlashInfer's fused kernel set (add+norm taking each all-reduced o/down output), FlashInfer attention over
    16-token pages holding one rank's KV heads: graphs replay eager's tokens at every decode batch size (bfloat16;
    two ranks sum in one addition, so padding the all-reduce changes no real row)."""
    eager = launch(workers.tensor_parallel, (preset, "bfloat16", "disabled", "auto", workers.FUSED_PAGED), 2)
    graphed = launch(workers.tensor_parallel, (preset, "bfloat16", str(backend), "auto", workers.FUSED_PAGED), 2)
    assert graphed["replayed"] == list(range(1, 65)), "every decode batch size 1..64 should have replayed a graph"
    for index, (want, have) in enumerate(zip(eager["tokens"], graphed["tokens"], strict=True)):
        assert have == want, f"prompt {index} diverged"


@needs_flashinfer
@pytest.mark.parametrize("preset", PRESETS)
def test_tp2_fused_kernel_logits_match_tp1_fused_kernel_logits_within_bf16(preset: str) -> None:
    """Dense-attention logits through the fused kernel set the engine set on the model, after a paged run: the
    all-reduced o/down outputs feed FlashInfer's fused add+norm as TP=1's unreduced ones do."""
    single = workers.single_gpu(preset, "bfloat16", Backend.FULL, workers.FUSED_PAGED)
    sharded = launch(workers.tensor_parallel, (preset, "bfloat16", "full", "auto", workers.FUSED_PAGED), 2)
    for have, want in zip(sharded["logits"], single["logits"], strict=True):
        torch.testing.assert_close(have, want, **BF16_LOGITS)


def test_symmetric_memory_is_chosen_where_peers_reach_each_other_and_matches_the_process_group() -> None:
    auto = launch(workers.tensor_parallel, ("tiny-qwen3-random", "bfloat16", "full", "auto"), 2)
    nccl = launch(workers.tensor_parallel, ("tiny-qwen3-random", "bfloat16", "full", "process-group"), 2)
    if torch.cuda.can_device_access_peer(0, 1):
        assert auto["all_reduce"] == "symm-mem", auto["reason"]
    assert nccl["all_reduce"] == "process-group"
    for have, want in zip(auto["logits"], nccl["logits"], strict=True):
        torch.testing.assert_close(have, want, **BF16_LOGITS)
