"""Tensor parallel on two and four GPUs: TP=2 and TP=4 graphs (full, breakable, tc_piecewise) against eager of the
same size at every decode batch size 1..64, TP=2 against TP=1, the all-reduce choice, ranks with different memory
budgets that still capture the same buckets, and ranks that exit.

Needs at least two CUDA devices (four for the TP=4 tests; skipped with the reason otherwise). Every process keeps
NVLink multicast off (the launcher sets ``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NVSHMEM_DISABLE_NVLS=1``).

Tolerances: float32 models must give TP=1's greedy tokens exactly (only the order of partial sums differs);
bfloat16 logits of TP=2 against TP=1 must agree within ``BF16_LOGITS`` (each all-reduce rounds the partial sums to
bfloat16 once, where TP=1 accumulates in one matmul).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import tp_gpu_workers as workers

from cudagraph.config import Backend
from cudagraph.engine import commands
from cudagraph.engine.distributed import launch

BF16_LOGITS = {"rtol": 5e-2, "atol": 5e-2}

needs_two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason=f"tensor-parallel GPU test: needs 2 CUDA devices, {torch.cuda.device_count()} visible; run `nox -s gpu` on "
    "a machine with two GPUs",
)
needs_four_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 4,
    reason=f"TP=4 GPU test: needs 4 CUDA devices, {torch.cuda.device_count()} visible",
)
pytestmark = [pytest.mark.gpu, needs_two_gpus]

PRESETS = ("tiny-qwen3-random", "tiny-llama-random")


@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE, Backend.TC_PIECEWISE])
@pytest.mark.parametrize("preset", PRESETS)
def test_tp2_graphs_give_tp2_eager_tokens_at_every_batch_size(preset: str, backend: Backend) -> None:
    eager = launch(workers.tensor_parallel, (preset, "float32", "disabled", "auto"), 2)
    graphed = launch(workers.tensor_parallel, (preset, "float32", str(backend), "auto"), 2)
    assert graphed["replayed"] == list(range(1, 65)), "every decode batch size 1..64 should have replayed a graph"
    for index, (want, have) in enumerate(zip(eager["tokens"], graphed["tokens"], strict=True)):
        assert have == want, f"prompt {index} diverged"


@needs_four_gpus
@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE, Backend.TC_PIECEWISE])
def test_tp4_graphs_give_tp4_eager_tokens_at_every_batch_size(backend: Backend) -> None:
    eager = launch(workers.tensor_parallel, ("tiny-qwen3-random", "float32", "disabled", "auto"), 4)
    graphed = launch(workers.tensor_parallel, ("tiny-qwen3-random", "float32", str(backend), "auto"), 4)
    assert graphed["replayed"] == list(range(1, 65)), "every decode batch size 1..64 should have replayed a graph"
    assert graphed["tokens"] == eager["tokens"]


@pytest.mark.parametrize("size", [2, 4], ids=["tp2", "tp4"])
def test_a_rank_with_a_smaller_budget_makes_every_rank_capture_the_same_buckets_and_finish(size: int) -> None:
    """The last rank's budget holds half the buckets, the others have none: the ranks share each capture decision,
    so all of them capture that rank's buckets, the same steps replay everywhere and no collective waits."""
    if torch.cuda.device_count() < size:
        pytest.skip(f"needs {size} CUDA devices, {torch.cuda.device_count()} visible")
    options = workers.EngineOptions(smaller_budget_rank=size - 1)
    eager = launch(workers.tensor_parallel, ("tiny-qwen3-random", "float32", "disabled", "auto"), size)
    graphed = launch(workers.tensor_parallel, ("tiny-qwen3-random", "float32", "full", "auto", options), size)
    captured = graphed["captured"]
    assert all(buckets == captured[0] for buckets in captured), captured
    assert 0 < len(captured[0]) < len(workers.DECODE_BUCKETS)
    assert set(graphed["replayed"]) == set(range(1, max(captured[0]) + 1))
    assert graphed["tokens"] == eager["tokens"]


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


def test_tp2_head_gathers_into_one_buffer_every_graph_shares_and_keeps_eager_tokens() -> None:
    """The vocabulary-parallel head's all-gather, captured in every decode bucket's graph on both ranks, writes into
    the one buffer the engine reserved before capturing (the largest bucket's rows), not into the graph pool."""
    eager = launch(workers.tensor_parallel, ("tiny-qwen3-random", "float32", "disabled", "auto"), 2)
    graphed = launch(workers.shared_head_gathers, "tiny-qwen3-random", 2)
    assert graphed["replayed"] == list(range(1, 65)), "every decode batch size 1..64 should have replayed a graph"
    assert graphed["tokens"] == eager["tokens"]
    for rank, seen in enumerate(graphed["ranks"]):
        assert seen["rows"] == max(workers.DECODE_BUCKETS), f"rank {rank}: {seen['rows']} rows reserved"
        assert sorted({rows for rows, _ in seen["captured"]}) == list(workers.DECODE_BUCKETS)
        assert {address for _, address in seen["captured"]} == {seen["address"]}, f"rank {rank} gathered elsewhere"


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


def test_tp2_ngram_speculation_replays_verify_graphs_and_gives_the_greedy_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``generate --tp-size 2 --speculative-tokens 2``: rank 0 drafts by n-gram lookup and its verify steps replay
    the verify graphs every rank captured; the tokens are those of TP=2 without speculation."""
    base = ["generate", "--preset", "tiny-llama-random", "--device", "cuda", "--attention-backend", "triton"]
    base += ["--prompt-token-ids", "5,6,7,5,6,7,5,6", "--prompt-token-ids", "1,2,3", "--max-new-tokens", "12"]
    base += ["--json", "-q", "--tp-size", "2"]
    assert commands.main(base) == 0
    plain = json.loads(capsys.readouterr().out)
    metrics = tmp_path / "metrics.json"
    assert commands.main([*base, "--speculative-tokens", "2", "--cuda-graph-metrics", str(metrics)]) == 0
    assert json.loads(capsys.readouterr().out)["outputs"] == plain["outputs"]
    verify = json.loads(metrics.read_text())["verify"]
    assert verify["steps"] > 0 and verify["replays"] == verify["steps"], verify


@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE])
def test_tp2_lazy_capture_sleep_and_wake_give_eager_tokens_and_the_same_buckets_on_both_ranks(backend: Backend) -> None:
    ranks = launch(workers.lazy_life_on_rank, ("tiny-qwen3-random", backend.value), 2)
    assert all(rank["started_with"] == [] for rank in ranks), "lazy: nothing captured before the first step"
    assert ranks[0]["after_first"] and ranks[0]["after_first"] == ranks[1]["after_first"]
    assert all(rank["asleep_with"] == [] for rank in ranks), "asleep: every graph given back"
    assert ranks[0]["after_wake"] == ranks[1]["after_wake"] and ranks[0]["after_wake"]
    assert all(rank["equal"] == [True, True] for rank in ranks)
    assert all(rank["replayed_after_wake"] > 0 and rank["state"] == "AWAKE" for rank in ranks)
    assert ranks[0]["lazy_captures"] == ranks[1]["lazy_captures"] > len(ranks[0]["after_first"])
    assert all(rank["freed_by_sleep"] > 0 for rank in ranks)
