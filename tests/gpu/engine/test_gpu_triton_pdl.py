"""Programmatic dependent launch of the engine's Triton kernels on a real GPU (Hopper or newer): the kernels launch
with PDL by default, and a launch with PDL computes exactly what the same launch without it computes, eagerly and in
every decode graph (full, breakable), on the Triton kernel set, the Triton attention kernels and the MoE GEMV
kernels. PDL changes when a kernel may start, never what it computes: every comparison here is bitwise.

The CPU side (``tests/engine_model/test_triton_pdl.py``) compiles every kernel for sm_90 and checks where it waits.
"""

from __future__ import annotations

import pytest
import torch
from test_gpu_engine_graphs import EAGER, config, engine, fill_cache, replayed_batch_sizes, shrinking_workload, tokens

from cudagraph.config import Backend
from cudagraph.engine.kernels.triton import moe, ops, pdl
from cudagraph.engine.testing import release_synthetic_batch, synthetic_decode_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0) or not pdl.triton_supports_pdl(),
        reason="programmatic dependent launch needs a GPU of compute capability 9.0+ and Triton 3.4+",
    ),
]


def test_the_kernels_launch_with_pdl_by_default_and_not_inside_use_pdl_false() -> None:
    assert pdl.pdl_enabled(), f"{pdl.PDL_ENV} is set off in this environment"
    assert pdl.pdl_launch(torch.device("cuda"))
    x = torch.randn(1, 256, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    on = ops.gemv(x, weight)
    with pdl.use_pdl(False):
        assert not pdl.pdl_launch(torch.device("cuda"))
        off = ops.gemv(x, weight)
    # Both compiled kernels are kept, one launched with the PDL attribute (the C launcher's PDL flag) and one without.
    flags = sorted(entry.prefix[2] for entry in ops._LAUNCH_GEMV._compiled.values() if entry is not None)
    assert 0 in flags and 1 in flags, flags
    assert torch.equal(on, off)


@pytest.mark.parametrize("preset", ["tiny-qwen3-random", "tiny-qwen3-moe-random"])
@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE])
def test_decode_graphs_with_pdl_give_the_logits_of_graphs_without_it(preset: str, backend: Backend) -> None:
    logits: dict[bool, list[torch.Tensor]] = {}
    for enabled in (False, True):
        with pdl.use_pdl(enabled), engine(preset, config(backend, Backend.DISABLED), attention="triton") as graphed:
            assert graphed.kernels.name == "triton"
            fill_cache(graphed, seed=5)
            runner = graphed.decode_cuda_graph_runner
            assert runner is not None
            logits[enabled] = []
            for batch_size in (1, 3, 16, 40):
                batch = synthetic_decode_batch(graphed, batch_size, context_len=40, seed=batch_size)
                logits[enabled].append(runner.replay(batch).clone())
                logits[enabled].append(graphed.forward(batch).clone())  # eager, with the same launches
                release_synthetic_batch(graphed, batch, 40)
    for index, (off, on) in enumerate(zip(logits[False], logits[True], strict=True)):
        assert torch.equal(on, off), f"step {index}: PDL changed the logits"


def test_graphs_with_pdl_give_eager_tokens_at_every_batch_size() -> None:
    prompts, params = shrinking_workload()
    with pdl.use_pdl(False), engine("tiny-qwen3-moe-random", EAGER, attention="triton") as eager:
        expected = tokens(eager, prompts, params)
    with engine("tiny-qwen3-moe-random", config(Backend.FULL, Backend.DISABLED), attention="triton") as graphed:
        got = tokens(graphed, prompts, params)
        seen = replayed_batch_sizes(graphed.decode_cuda_graph_runner)
    assert seen == list(range(1, 65))
    assert got == expected


def test_the_moe_gemv_kernels_with_pdl_in_a_graph_equal_them_without() -> None:
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4, 2048, device="cuda", generator=generator).to(torch.bfloat16)
    gate_up = (torch.randn(16, 1536, 2048, device="cuda", generator=generator) / 45).to(torch.bfloat16)
    down = (torch.randn(16, 2048, 768, device="cuda", generator=generator) / 28).to(torch.bfloat16)
    weights = torch.softmax(torch.randn(4, 8, device="cuda", generator=generator), dim=-1)
    experts = torch.randperm(16, device="cuda", generator=generator)[:8].repeat(4, 1)
    with pdl.use_pdl(False):
        want = moe.moe_experts(x, weights, experts, gate_up, down, 0)
    moe.moe_experts(x, weights, experts, gate_up, down, 0)  # compiled outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        have = moe.moe_experts(x, weights, experts, gate_up, down, 0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(have, want)
