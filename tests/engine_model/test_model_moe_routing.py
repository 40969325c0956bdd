"""The sparse block's routing as properties: for any router scores every token reaches exactly its top-k experts, and
its combine weights sum to 1 (``norm_topk_prob``) or to the softmax mass of those experts; both expert computations,
and the experts split over ranks, give the same outputs; and nothing in the block breaks a ``fullgraph`` trace (no
host sync, no shape that depends on the routing)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.fx.experimental._config as fx_config
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._dynamo.utils import counters

from cudagraph.engine.model import RowRange, model_config_from_preset
from cudagraph.engine.model.moe import EXPERT_COMPUTES_BY_NAME, SparseMoE, choose_expert_compute

TINY_MOE = model_config_from_preset("tiny-qwen3-moe-random")
HIDDEN = TINY_MOE.hidden_size
GATE = 2.0
"""Every expert's gate pre-activation in the marker block: its output is ``silu(GATE) * 1``."""


def marker_block(
    num_experts: int, top_k: int, normalize: bool, compute: str, experts: RowRange | None = None
) -> SparseMoE:
    """A block whose router logits are ``x[:, 1 : 1 + num_experts]`` and whose expert ``e`` outputs the one-hot
    vector of channel ``e`` whenever ``x[:, 0] == 1``: its output row is the token's combine weights."""
    config = TINY_MOE.with_overrides(
        num_experts=num_experts, num_experts_per_tok=top_k, norm_topk_prob=normalize, moe_intermediate_size=4
    )
    block = SparseMoE(config, torch.float32, torch.device("cpu"), experts=experts)
    block.expert_compute = EXPERT_COMPUTES_BY_NAME[compute]
    with torch.no_grad():
        block.router_weight.zero_()
        block.router_weight[:, 1 : 1 + num_experts] = torch.eye(num_experts)
        block.gate_up_weight.zero_()
        block.down_weight.zero_()
        for local, expert in enumerate(range(block.first_expert, block.first_expert + block.gate_up_weight.shape[0])):
            block.gate_up_weight[local, 0, 0] = GATE  # gate row 0 reads the constant channel
            block.gate_up_weight[local, 4, 0] = 1.0  # up row 0 (rows 4.. are up) reads it too
            block.down_weight[local, expert, 0] = 1 / torch.nn.functional.silu(torch.tensor(GATE))
    return block


def marker_input(scores: torch.Tensor) -> torch.Tensor:
    x = torch.zeros(scores.shape[0], HIDDEN)
    x[:, 0] = 1.0
    x[:, 1 : 1 + scores.shape[1]] = scores
    return x


@st.composite
def router_scores(draw: st.DrawFn) -> tuple[torch.Tensor, int]:
    num_experts = draw(st.integers(2, 8))
    tokens = draw(st.integers(1, 6))
    top_k = draw(st.integers(1, num_experts))
    values = draw(
        st.lists(
            st.floats(-8, 8, allow_nan=False, width=32), min_size=tokens * num_experts, max_size=tokens * num_experts
        )
    )
    return torch.tensor(values).view(tokens, num_experts), top_k


@settings(max_examples=60, deadline=None)
@given(scored=router_scores(), normalize=st.booleans(), compute=st.sampled_from(["dense", "grouped_mm"]))
def test_every_token_reaches_exactly_its_top_k_experts(
    scored: tuple[torch.Tensor, int], normalize: bool, compute: str
) -> None:
    scores, top_k = scored
    with torch.no_grad():
        combine = marker_block(scores.shape[1], top_k, normalize, compute)(marker_input(scores))[:, : scores.shape[1]]
    probabilities = torch.softmax(scores.double(), dim=-1)
    for token in range(scores.shape[0]):
        reached = (combine[token] > 0).nonzero().flatten().tolist()
        assert len(reached) == top_k, f"token {token} reached {reached}, not {top_k} experts"
        others = [e for e in range(scores.shape[1]) if e not in reached]
        if others:  # a reached expert's probability is never below a left-out one's (ties may go either way)
            router = torch.softmax(scores[token], dim=-1)
            assert router[reached].min() >= router[others].max()
        expected_sum = 1.0 if normalize else float(probabilities[token, reached].sum())
        assert float(combine[token].sum()) == pytest.approx(expected_sum, rel=1e-5, abs=1e-6)
        mass = probabilities[token, reached]
        expected = mass / mass.sum() if normalize else mass
        torch.testing.assert_close(combine[token, reached].double(), expected, rtol=1e-5, atol=1e-6)


def random_block(
    compute: str, experts: RowRange | None = None, seed: int = 0, dtype: torch.dtype = torch.float32
) -> SparseMoE:
    block = SparseMoE(TINY_MOE, dtype, torch.device("cpu"), experts=experts)
    block.expert_compute = EXPERT_COMPUTES_BY_NAME[compute]
    generator = torch.Generator().manual_seed(seed)
    whole = {
        "router_weight": torch.randn(TINY_MOE.num_experts, HIDDEN, generator=generator),
        "gate_up_weight": torch.randn(TINY_MOE.num_experts, 2 * 32, HIDDEN, generator=generator) / 8,
        "down_weight": torch.randn(TINY_MOE.num_experts, HIDDEN, 32, generator=generator) / 6,
    }
    held = experts or RowRange(0, TINY_MOE.num_experts)
    with torch.no_grad():
        block.router_weight.copy_(whole["router_weight"])
        block.gate_up_weight.copy_(whole["gate_up_weight"][held.start : held.stop])
        block.down_weight.copy_(whole["down_weight"][held.start : held.stop])
    return block


@settings(max_examples=25, deadline=None)
@given(tokens=st.integers(1, 40), ranks=st.sampled_from([1, 2, 4, 8]), seed=st.integers(0, 2**16))
def test_grouped_mm_and_split_experts_give_the_dense_outputs(tokens: int, ranks: int, seed: int) -> None:
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        expected = random_block("dense", seed=seed)(x)
        per_rank = TINY_MOE.num_experts // ranks
        for compute in ("dense", "grouped_mm"):
            parts = [
                random_block(compute, RowRange(rank * per_rank, (rank + 1) * per_rank), seed)(x)
                for rank in range(ranks)
            ]
            torch.testing.assert_close(torch.stack(parts).sum(0), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("compute", "dtype"), [("dense", torch.float32), ("grouped_mm", torch.bfloat16)])
def test_the_block_traces_as_one_graph(compute: str, dtype: torch.dtype) -> None:
    # fullgraph: a host sync (.item(), .tolist()) or a routing-dependent shape (nonzero, mask indexing) would break
    # the trace and fail here. (Traced, _grouped_mm takes bfloat16 only, as on the GPU.)
    # One graph for every token count (1 included), as tc_piecewise compiles a bucket-independent forward.
    torch._dynamo.reset()
    counters.clear()
    block = random_block(compute, RowRange(2, 6), dtype=dtype)
    compiled = torch.compile(block, backend="eager", fullgraph=True)
    for index, tokens in enumerate((5, 1, 9)):
        x = torch.randn(tokens, HIDDEN, dtype=dtype)
        if index == 0:
            torch._dynamo.mark_dynamic(x, 0)
        with torch.no_grad(), fx_config.patch(backed_size_oblivious=True):
            torch.testing.assert_close(compiled(x), block(x))
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


def test_the_dense_path_is_chosen_off_cuda_and_for_float32() -> None:
    assert choose_expert_compute(torch.device("cpu"), torch.bfloat16).name == "dense"
    assert choose_expert_compute(torch.device("cpu"), torch.float32).name == "dense"
