"""Qwen3-MoE graphs on a real GPU: the tiny MoE model's decode graphs (full, breakable, tc_piecewise) give eager
tokens at every decode batch size 1..64, the ``triton_gemv`` and ``grouped_mm`` expert computations agree with the
dense one in bfloat16 and capture in a CUDA graph (no host sync), a bfloat16 model replays its eager logits, and the
experts split over two GPUs give TP=2 eager tokens from every graph backend.

On CUDA a model computes its experts with ``triton_gemv``: the Triton GEMV kernels for steps of up to
``MOE_GEMV_MAX_TOKENS`` tokens, the wide path above (``grouped_mm`` in bfloat16 on compute capability 9.x/10.x, else
dense). Float32 models must reproduce eager tokens exactly; bfloat16 comparisons hold logits or block outputs to
``BF16``.
"""

from __future__ import annotations

import pytest
import torch
import tp_gpu_workers as workers
from test_gpu_engine_graphs import EAGER, config, engine, replayed_batch_sizes, shrinking_workload, tokens

from cudagraph.config import Backend
from cudagraph.engine.distributed import launch
from cudagraph.engine.kernels.triton.moe import MOE_GEMV_MAX_TOKENS
from cudagraph.engine.model import RowRange, model_config_from_preset
from cudagraph.engine.model.moe import EXPERT_COMPUTES_BY_NAME, SparseMoE, choose_expert_compute
from cudagraph.engine.testing import release_synthetic_batch, synthetic_decode_batch

pytestmark = pytest.mark.gpu

PRESET = "tiny-qwen3-moe-random"
BF16 = {"rtol": 2e-2, "atol": 2e-2}

needs_grouped_mm = pytest.mark.skipif(
    not torch.cuda.is_available()
    or not EXPERT_COMPUTES_BY_NAME["grouped_mm"].applies(torch.device("cuda"), torch.bfloat16),
    reason="grouped_mm experts need torch._grouped_mm and a GPU of compute capability 9.x or 10.x (H100, H200, B200)",
)
needs_triton_gemv = pytest.mark.skipif(
    not torch.cuda.is_available() or choose_expert_compute(torch.device("cuda"), torch.bfloat16).name != "triton_gemv",
    reason="triton_gemv experts need a CUDA device and Triton",
)


@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE, Backend.TC_PIECEWISE])
def test_moe_decode_graphs_give_eager_tokens_at_every_batch_size(backend: Backend) -> None:
    prompts, params = shrinking_workload()
    with engine(PRESET, EAGER) as eager:
        expected = tokens(eager, prompts, params)
    with engine(PRESET, config(backend, Backend.DISABLED)) as graphed:
        runner = graphed.decode_cuda_graph_runner
        assert runner is not None and runner.stats.graphs == 9
        assert all(isinstance(layer.mlp, SparseMoE) for layer in graphed.model.layers)
        assert {layer.mlp.expert_compute.name for layer in graphed.model.layers} == {"triton_gemv"}
        got = tokens(graphed, prompts, params)
        seen = replayed_batch_sizes(runner)
    assert seen == list(range(1, 65)), "every decode batch size 1..64 should have replayed a graph"
    for index, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert have == want, f"prompt {index} diverged"


def cuda_block(compute: str, experts: RowRange | None = None, seed: int = 0) -> SparseMoE:
    """A bfloat16 block of the Qwen3-30B-A3B expert shapes (128 experts, top-8, width 768, hidden 2048)."""
    shape = model_config_from_preset("qwen3-30b-a3b-random")
    block = SparseMoE(shape, torch.bfloat16, torch.device("cuda"), experts=experts)
    block.expert_compute = EXPERT_COMPUTES_BY_NAME[compute]
    generator = torch.Generator(device="cuda").manual_seed(seed)
    held = experts or RowRange(0, shape.num_experts)
    with torch.no_grad():
        for name, parameter in block.named_parameters():
            whole_rows = shape.num_experts if name == "router_weight" else held.size
            assert parameter.shape[0] == whole_rows
            draw = torch.randn(parameter.shape, generator=generator, device="cuda") / parameter.shape[-1] ** 0.5
            parameter.copy_(draw)
    return block


def fused_cases(grouped_mm_tokens: tuple[int, ...], triton_gemv_tokens: tuple[int, ...]) -> list[object]:
    """(compute, tokens count) cases of both fused expert computations, each skipped where its kernels can't run."""
    return [
        *(pytest.param("grouped_mm", n, marks=needs_grouped_mm, id=f"grouped_mm-{n}") for n in grouped_mm_tokens),
        *(pytest.param("triton_gemv", n, marks=needs_triton_gemv, id=f"triton_gemv-{n}") for n in triton_gemv_tokens),
    ]


@pytest.mark.parametrize(
    ("compute", "tokens_count"),
    fused_cases((1, 7, 32, 513), (1, 4, MOE_GEMV_MAX_TOKENS, MOE_GEMV_MAX_TOKENS + 1)),
)
@pytest.mark.parametrize("experts", [None, RowRange(32, 64)], ids=["all-experts", "rank-1-of-4"])
def test_fused_experts_agree_with_the_dense_experts_in_bfloat16(
    compute: str, tokens_count: int, experts: RowRange | None
) -> None:
    fused, dense = cuda_block(compute, experts), cuda_block("dense", experts)
    x = torch.randn(tokens_count, 2048, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), dense(x), **BF16)


@pytest.mark.parametrize(("compute", "tokens_count"), fused_cases((16,), (1, 8)))
def test_fused_experts_capture_in_a_cuda_graph_and_replay_new_tokens(compute: str, tokens_count: int) -> None:
    block = cuda_block(compute, RowRange(0, 64))
    static_x = torch.randn(tokens_count, 2048, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        block(static_x)  # warm up outside the capture (kernel selection, workspaces; Triton compiles here)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # a host sync inside would raise here
            static_out = block(static_x)
        for seed in range(3):
            static_x.copy_(torch.randn(static_x.shape, generator=torch.Generator().manual_seed(seed)).cuda())
            graph.replay()  # new tokens: a new routing, read by the kernels on the device
            torch.testing.assert_close(static_out, block(static_x), rtol=0, atol=0)


@needs_triton_gemv
@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE, Backend.TC_PIECEWISE])
def test_bfloat16_moe_model_replays_its_eager_logits(backend: Backend) -> None:
    with engine(PRESET, config(backend, Backend.DISABLED), dtype="bfloat16") as graphed:
        assert {layer.mlp.expert_compute.name for layer in graphed.model.layers} == {"triton_gemv"}
        runner = graphed.decode_cuda_graph_runner
        assert runner is not None
        # Batch sizes that are buckets: eager and replay then run the same kernels on the same rows (1, 8 and 32 on
        # the GEMV kernels, 64 on the wide path). (Padded, the router's matmul may round one bfloat16 logit
        # differently and flip a near-tied expert; float32 padded runs are checked token for token above.)
        for size in (1, 8, 32, 64):
            batch = synthetic_decode_batch(graphed, size, context_len=20, seed=size)
            eager = graphed.forward(batch).clone()
            replayed = runner.replay(batch).clone()
            release_synthetic_batch(graphed, batch, context_len=20)
            torch.testing.assert_close(replayed, eager, **BF16)


needs_two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason=f"expert-parallel GPU test: needs 2 CUDA devices, {torch.cuda.device_count()} visible",
)


@needs_two_gpus
@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE, Backend.TC_PIECEWISE])
def test_tp2_moe_graphs_give_tp2_eager_tokens_at_every_batch_size(backend: Backend) -> None:
    eager = launch(workers.tensor_parallel, (PRESET, "float32", "disabled", "auto"), 2)
    graphed = launch(workers.tensor_parallel, (PRESET, "float32", str(backend), "auto"), 2)
    assert graphed["replayed"] == list(range(1, 65)), "every decode batch size 1..64 should have replayed a graph"
    assert graphed["tokens"] == eager["tokens"]
