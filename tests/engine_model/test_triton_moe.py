"""The Triton MoE GEMV kernels (``kernels.triton.moe``) against the plain-torch experts (``model.moe.dense_experts``)
and the rule that picks them: on the GPU where there is one, else on CPU tensors through Triton's interpreter
(``TRITON_INTERPRET=1``, set by ``tests/conftest.py``).

Shapes are small (the interpreter runs every program in Python) but cover what the kernels branch on: several top-k,
hidden sizes and widths that are and are not powers of two or multiples of a tile, expert counts, experts held by a
range (another rank's add nothing), and float32, float16 and bfloat16 (the interpreter truncates bfloat16 where the
GPU rounds, hence its looser tolerance here; the GPU tests hold bfloat16 to the grouped path's rounding).
``nox -s tests`` keeps a shape of each dtype, one split tiling and one held range; the other shapes are ``slow``."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.fx.experimental._config as fx_config
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._dynamo.utils import counters

pytest.importorskip("triton", reason="triton is not installed: pip install triton (CUDA builds of torch bring it)")

from cudagraph.engine.kernels.triton import moe as triton_moe
from cudagraph.engine.model import RowRange, model_config_from_preset
from cudagraph.engine.model import moe as model_moe
from cudagraph.engine.model.moe import (
    EXPERT_COMPUTES_BY_NAME,
    Routing,
    SparseMoE,
    choose_expert_compute,
    dense_experts,
    gemv_experts,
    route,
)

pytestmark = pytest.mark.usefixtures("interpreter_or_gpu")  # conftest.py: skip where no kernel can run

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 4e-3, "rtol": 4e-3},
    torch.bfloat16: {"atol": 6e-2, "rtol": 6e-2},
}


def expert_problem(
    tokens: int, hidden: int, width: int, num_experts: int, top_k: int, dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, Routing, torch.Tensor, torch.Tensor]:
    """Token rows, a routing from random router scores, and every expert's weights (scaled to unit outputs)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=generator)
    gate_up = torch.randn(num_experts, 2 * width, hidden, generator=generator) / hidden**0.5
    down = torch.randn(num_experts, hidden, width, generator=generator) / width**0.5
    routing = route(torch.randn(tokens, num_experts, generator=generator), top_k, normalize=True)
    on_device = Routing(routing.weights.to(DEVICE), routing.experts.to(DEVICE))
    return x.to(DEVICE, dtype), on_device, gate_up.to(DEVICE, dtype), down.to(DEVICE, dtype)


def reference(
    x: torch.Tensor, routing: Routing, gate_up: torch.Tensor, down: torch.Tensor, first_expert: int
) -> torch.Tensor:
    """``dense_experts`` in float64 on the same (rounded) inputs."""
    return dense_experts(x.double(), routing, gate_up.double(), down.double(), first_expert)


@pytest.mark.parametrize(
    ("tokens", "hidden", "width", "num_experts", "top_k", "dtype"),
    [
        (1, 64, 32, 8, 2, torch.float32),
        (3, 96, 48, 8, 1, torch.float32),
        pytest.param(2, 64, 40, 16, 4, torch.float32, marks=pytest.mark.slow),
        pytest.param(5, 160, 32, 4, 4, torch.float32, marks=pytest.mark.slow),  # the interpreter's slowest shape
        (2, 64, 32, 8, 3, torch.float16),
        (3, 96, 48, 16, 2, torch.bfloat16),
    ],
)
def test_the_gemv_kernels_give_the_weighted_sum_of_each_tokens_experts(
    tokens: int, hidden: int, width: int, num_experts: int, top_k: int, dtype: torch.dtype
) -> None:
    x, routing, gate_up, down = expert_problem(tokens, hidden, width, num_experts, top_k, dtype)
    out = triton_moe.moe_experts(x, routing.weights, routing.experts, gate_up, down, 0)
    assert out.shape == (tokens, hidden) and out.dtype == dtype
    torch.testing.assert_close(out.double(), reference(x, routing, gate_up, down, 0), **TOLERANCE[dtype])


@pytest.mark.parametrize(
    "tiles",
    [
        pytest.param(
            triton_moe.MoeTiles(gate_up=triton_moe.MoeTile(2, 32), down=triton_moe.MoeTile(8, 16)),
            marks=pytest.mark.slow,
        ),
        triton_moe.MoeTiles(gate_up=triton_moe.MoeTile(8, 64, num_warps=8), down=triton_moe.MoeTile(2, 32)),
    ],
)
def test_tiles_that_split_each_reduction_into_several_steps_give_the_same_sums(tiles: triton_moe.MoeTiles) -> None:
    # hidden 96 and width 40: three reduction steps each, the last one masked (the table's tiles read them in one).
    x, routing, gate_up, down = expert_problem(3, 96, 40, 8, 2, torch.float32, seed=2)
    out = triton_moe.moe_experts(x, routing.weights, routing.experts, gate_up, down, 0, tiles=tiles)
    torch.testing.assert_close(out.double(), reference(x, routing, gate_up, down, 0), **TOLERANCE[torch.float32])


@pytest.mark.parametrize(
    ("start", "stop"), [(2, 6), *(pytest.param(*held, marks=pytest.mark.slow) for held in [(0, 4), (6, 8), (3, 4)])]
)
def test_experts_held_elsewhere_add_nothing(start: int, stop: int) -> None:
    # A rank holding experts [start, stop) of 8 adds only those experts' weighted outputs: the ranks' parts sum to the
    # whole (checked for the dense path in test_model_moe_routing.py).
    x, routing, gate_up, down = expert_problem(4, 64, 32, 8, 3, torch.float32, seed=1)
    held_gate_up, held_down = gate_up[start:stop].contiguous(), down[start:stop].contiguous()
    out = triton_moe.moe_experts(x, routing.weights, routing.experts, held_gate_up, held_down, start)
    want = reference(x, routing, held_gate_up, held_down, start)
    assert (want != 0).any() or not ((routing.experts >= start) & (routing.experts < stop)).any()
    torch.testing.assert_close(out.double(), want, **TOLERANCE[torch.float32])


def test_a_token_whose_experts_are_all_elsewhere_gets_zeros() -> None:
    x, _, gate_up, down = expert_problem(2, 64, 32, 4, 2, torch.float32)
    routing = Routing(
        torch.full((2, 2), 0.5, device=DEVICE), torch.tensor([[0, 1], [4, 5]], device=DEVICE, dtype=torch.int64)
    )
    out = triton_moe.moe_experts(
        x, routing.weights, routing.experts, gate_up[2:].contiguous(), down[2:].contiguous(), 2
    )
    assert torch.equal(out, torch.zeros_like(out))


def test_an_empty_step_launches_nothing_and_bad_shapes_are_refused() -> None:
    x, routing, gate_up, down = expert_problem(2, 64, 32, 4, 2, torch.float32)
    empty = triton_moe.moe_experts(x[:0], routing.weights[:0], routing.experts[:0], gate_up, down, 0)
    assert empty.shape == (0, 64)
    with pytest.raises(ValueError, match=r"down_weight \[E, 64, I\]"):
        triton_moe.moe_experts(x, routing.weights, routing.experts, gate_up, down[:, :32].contiguous(), 0)
    with pytest.raises(ValueError, match=r"weights and experts of \[2, top_k\]"):
        triton_moe.moe_experts(x, routing.weights[:1], routing.experts, gate_up, down, 0)


@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(0, 4 * triton_moe.MOE_GEMV_MAX_TOKENS))
def test_the_kernels_serve_steps_up_to_the_crossover_and_the_wide_path_the_rest(tokens: int) -> None:
    calls: list[str] = []
    x = torch.zeros(tokens, 8, device=DEVICE)
    routing = Routing(torch.ones(tokens, 1, device=DEVICE), torch.zeros(tokens, 1, dtype=torch.int64, device=DEVICE))
    with pytest.MonkeyPatch.context() as patch:  # record which computation runs instead of running it
        patch.setattr(triton_moe, "moe_experts", lambda x, *_: calls.append("gemv") or x)
        patch.setattr(model_moe, "wide_experts", lambda x, *_: calls.append("wide") or x)
        gemv_experts(x, routing, torch.zeros(1, 4, 8, device=DEVICE), torch.zeros(1, 8, 2, device=DEVICE), 0)
    fits = tokens <= triton_moe.MOE_GEMV_MAX_TOKENS
    assert triton_moe.uses_moe_gemv(tokens) is fits
    assert calls == (["gemv"] if fits else ["wide"])


def test_the_gemv_row_comes_first_on_cuda_and_never_off_it() -> None:
    # Chosen from the device type and Triton's presence only: no CUDA call is needed to ask.
    assert [row.name for row in model_moe.EXPERT_COMPUTES] == ["triton_gemv", "grouped_mm", "dense"]
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert choose_expert_compute(torch.device("cuda"), dtype).name == "triton_gemv"
        assert choose_expert_compute(torch.device("cpu"), dtype).name == "dense"


TINY_MOE = model_config_from_preset("tiny-qwen3-moe-random")


def gemv_block(experts: RowRange | None = None) -> SparseMoE:
    """The tiny MoE block (8 experts, top-2, hidden 64, width 32) with random weights on the GEMV computation."""
    block = SparseMoE(TINY_MOE, torch.float32, torch.device(DEVICE), experts=experts)
    block.expert_compute = EXPERT_COMPUTES_BY_NAME["triton_gemv"]
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in block.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) / parameter.shape[-1] ** 0.5)
    return block


def test_the_block_on_the_gemv_kernels_equals_the_block_on_the_dense_experts() -> None:
    block = gemv_block(RowRange(2, 6))
    x = torch.randn(3, TINY_MOE.hidden_size, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    with torch.no_grad():
        have = block(x)
        block.expert_compute = EXPERT_COMPUTES_BY_NAME["dense"]
        want = block(x)
    torch.testing.assert_close(have, want, **TOLERANCE[torch.float32])


@pytest.mark.usefixtures("fresh_dynamo")
def test_a_traced_block_calls_the_custom_op_and_compiles_once_for_every_token_count() -> None:
    # fullgraph: dynamo must not trace into the launches (it cannot); the op picks kernels or the wide path on the
    # real tensors, so one graph serves a step below the crossover and one above it.
    block = gemv_block()
    compiled = torch.compile(block, backend="eager", fullgraph=True)
    above = triton_moe.MOE_GEMV_MAX_TOKENS + 3
    for index, tokens in enumerate((2, above, 1)):
        x = torch.randn(tokens, TINY_MOE.hidden_size, generator=torch.Generator().manual_seed(tokens)).to(DEVICE)
        if index == 0:
            torch._dynamo.mark_dynamic(x, 0)
        with torch.no_grad(), fx_config.patch(backed_size_oblivious=True):
            torch.testing.assert_close(compiled(x), block(x), rtol=0, atol=0)
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1
