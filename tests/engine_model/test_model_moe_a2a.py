"""Expert parallel by token exchange (``moe_a2a``) as properties, with ``N`` ranks simulated in one process (the
all-to-all is a block transpose, the all-gather a concatenation): for any routing, dispatching every rank's share
of the tokens to the experts' ranks, running the held experts and combining the results back gives the single-rank
dense block's output; the ids survive the trip in the dtypes a model runs in; the option is refused where it cannot
apply; and ``tc_piecewise`` traces an exchanging block whole and splits it at both all-to-alls (over a loopback group
of one rank)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch._dynamo
import torch.fx.experimental._config as fx_config
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch._dynamo.utils import counters

from cudagraph.backend import PiecewiseCompiler
from cudagraph.backend_utils import is_split_op
from cudagraph.engine.model import ShardPlan, TensorParallelError, model_config_from_preset
from cudagraph.engine.model.collectives import register_communicator, unregister_communicator
from cudagraph.engine.model.moe import Routing, SparseMoE, dense_experts
from cudagraph.engine.model.moe_a2a import (
    ExpertExchange,
    combine,
    exact_integer_limit,
    owned_tokens,
    pack,
    plan_dispatch,
    unpack,
)

HIDDEN, WIDTH = 8, 4


@st.composite
def routed_tokens(draw: st.DrawFn) -> tuple[int, int, int, torch.Tensor, torch.Tensor]:
    """``(world_size, experts_per_rank, tokens, weights [T, k], experts [T, k])``: distinct experts per token."""
    world_size = draw(st.integers(1, 4))
    experts_per_rank = draw(st.integers(1, 3))
    num_experts = world_size * experts_per_rank
    top_k = draw(st.integers(1, num_experts))
    tokens = draw(st.integers(1, 9))
    chosen = [draw(st.permutations(range(num_experts)))[:top_k] for _ in range(tokens)]
    weights = draw(st.lists(st.floats(0.0, 1.0), min_size=tokens * top_k, max_size=tokens * top_k))
    return (
        world_size,
        experts_per_rank,
        tokens,
        torch.tensor(weights, dtype=torch.float32).view(tokens, top_k),
        torch.tensor(chosen, dtype=torch.int64),
    )


def expert_weights(num_experts: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(num_experts, 2 * WIDTH, HIDDEN, generator=generator, dtype=torch.float64)
    down = torch.randn(num_experts, HIDDEN, WIDTH, generator=generator, dtype=torch.float64)
    return gate_up, down


def simulated_exchange(
    x: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    world_size: int,
    experts_per_rank: int,
    gate_up: torch.Tensor,
    down: torch.Tensor,
) -> torch.Tensor:
    """Every rank's dispatch, experts and combine, the collectives done by hand; the gathered ``[T, H]``."""
    tokens, top_k = experts.shape
    exchanges = [ExpertExchange("sim", rank, world_size, experts_per_rank) for rank in range(world_size)]
    owned = [owned_tokens(x, exchange) for exchange in exchanges]
    per_rank = owned[0].shape[0]
    padded_weights = torch.nn.functional.pad(weights, (0, 0, 0, world_size * per_rank - tokens))
    padded_experts = torch.nn.functional.pad(experts, (0, 0, 0, world_size * per_rank - tokens))
    plans, sent = [], []
    for rank in range(world_size):
        rows = slice(rank * per_rank, (rank + 1) * per_rank)
        plan = plan_dispatch(
            padded_weights[rows], padded_experts[rows], rank * per_rank, tokens, world_size, experts_per_rank
        )
        plans.append(plan)
        sent.append(pack(owned[rank], plan, world_size, top_k, experts_per_rank))
    outputs = []
    for rank in range(world_size):
        received = torch.stack([sent[source][rank] for source in range(world_size)])  # the all-to-all
        rows, local_ids = unpack(received)
        held = slice(rank * experts_per_rank, (rank + 1) * experts_per_rank)
        ones = torch.ones(rows.shape[0], 1)
        out = dense_experts(rows, Routing(ones, local_ids.unsqueeze(1)), gate_up[held], down[held], 0)
        outputs.append(out.view(received.shape[0], received.shape[1], HIDDEN))
    combined = []
    for rank in range(world_size):
        returned = torch.stack([outputs[source][rank] for source in range(world_size)])  # the all-to-all back
        combined.append(combine(returned, plans[rank], top_k))
    return torch.cat(combined)[:tokens]  # the all-gather


@settings(max_examples=80, deadline=None)
@given(routed_tokens(), st.integers(0, 2**16))
@example((2, 1, 3, torch.ones(3, 1), torch.zeros(3, 1, dtype=torch.int64)), 0)  # every token to rank 0's expert
def test_exchanged_tokens_give_the_single_rank_dense_block(routed, seed: int) -> None:
    world_size, experts_per_rank, tokens, weights, experts = routed
    gate_up, down = expert_weights(world_size * experts_per_rank, seed)
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    expected = dense_experts(x, Routing(weights, experts), gate_up, down, 0)
    got = simulated_exchange(x, weights, experts, world_size, experts_per_rank, gate_up, down)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


@given(routed_tokens())
def test_every_assignment_gets_its_own_slot_in_its_experts_rank_block(routed) -> None:
    world_size, experts_per_rank, tokens, weights, experts = routed
    top_k = experts.shape[1]
    plan = plan_dispatch(weights, experts, 0, tokens, world_size, experts_per_rank)
    capacity = tokens * top_k
    assert plan.slots.unique().numel() == capacity, "two assignments share a slot"
    torch.testing.assert_close(plan.slots.div(capacity, rounding_mode="floor"), experts.flatten() // experts_per_rank)
    torch.testing.assert_close(plan.local_experts, experts.flatten() % experts_per_rank)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_local_expert_ids_survive_the_trip_as_values_of_the_activations_dtype(dtype: torch.dtype) -> None:
    experts_per_rank = min(exact_integer_limit(dtype), 4096)
    ids = torch.arange(experts_per_rank + 1)  # the empty id included
    plan = plan_dispatch(torch.ones(ids.numel(), 1), ids.unsqueeze(1), 0, ids.numel(), 1, experts_per_rank + 1)
    packed = pack(torch.zeros(ids.numel(), HIDDEN, dtype=dtype), plan, 1, 1, experts_per_rank)
    _, received_ids = unpack(packed)
    assert torch.equal(received_ids.sort().values, ids)


def test_more_experts_per_rank_than_bfloat16_counts_exactly_is_refused() -> None:
    exchange = ExpertExchange("tp", 0, 2, 512)
    with pytest.raises(ValueError, match=r"exact up to 256; 512 experts per rank need more"):
        exchange.check_dtype(torch.bfloat16)
    exchange.check_dtype(torch.float32)


def test_padding_tokens_of_the_last_rank_go_nowhere_and_weigh_nothing() -> None:
    x = torch.randn(3, HIDDEN)
    last = ExpertExchange("tp", 1, 2, 1)
    assert torch.equal(owned_tokens(x, last), torch.cat([x[2:], torch.zeros(1, HIDDEN)]))
    plan = plan_dispatch(torch.ones(2, 1), torch.zeros(2, 1, dtype=torch.int64), 2, 3, 2, 1)
    assert plan.slots.tolist() == [0, 2 * 2]  # token 2 to rank 0's block; the padding token to the unsent block
    assert plan.weights.tolist() == [1.0, 0.0] and plan.local_experts.tolist() == [0, 1]


@pytest.mark.parametrize(
    ("preset", "size", "message"),
    [
        ("tiny-qwen3-random", 2, r"this model has none \(a dense MLP\); use 'none'"),
        ("tiny-qwen3-moe-random", 1, r"needs a tensor-parallel size of at least 2"),
    ],
)
def test_all_to_all_without_experts_or_without_a_second_rank_is_one_clear_error(
    preset: str, size: int, message: str
) -> None:
    with pytest.raises(TensorParallelError, match=message):
        ShardPlan(rank=0, size=size, group_name="tp", moe_a2a_backend="all_to_all").check(
            model_config_from_preset(preset)
        )


def test_an_unknown_a2a_backend_names_the_allowed_ones() -> None:
    with pytest.raises(TensorParallelError, match=r"'deepep' is not one of none, all_to_all"):
        ShardPlan(rank=0, size=2, group_name="tp", moe_a2a_backend="deepep")


class LoopbackCommunicator:
    """A group of one rank: every block of an all-to-all comes back to its sender, an all-gather stacks one."""

    world_size = 1

    def all_reduce_(self, tensor: torch.Tensor) -> None:
        """One rank's sum is its own tensor."""

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``[1, *tensor.shape]``."""
        return tensor.unsqueeze(0).clone()

    def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        """The only block, back to this rank."""
        return tensor.clone()


@pytest.fixture
def loopback_group() -> Iterator[str]:
    torch._dynamo.reset()
    counters.clear()
    register_communicator("loopback", LoopbackCommunicator())
    yield "loopback"
    unregister_communicator("loopback")
    torch._dynamo.reset()


def test_tc_piecewise_splits_an_exchanging_block_at_both_all_to_alls_and_traces_it_whole(loopback_group: str) -> None:
    config = model_config_from_preset("tiny-qwen3-moe-random")
    exchange = ExpertExchange(loopback_group, 0, 1, config.num_experts)
    exchanging = SparseMoE(config, torch.float32, torch.device("cpu"), exchange=exchange)
    plain = SparseMoE(config, torch.float32, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for mine, theirs in zip(exchanging.parameters(), plain.parameters(), strict=True):
            mine.copy_(torch.randn(mine.shape, generator=generator) / mine.shape[-1] ** 0.5)
            theirs.copy_(mine)
    compiler = PiecewiseCompiler("eager")
    compiled = torch.compile(exchanging, backend=compiler, fullgraph=True)
    for index, tokens in enumerate((5, 1, 8)):
        x = torch.randn(tokens, config.hidden_size, generator=generator)
        if index == 0:
            torch._dynamo.mark_dynamic(x, 0)
        with torch.no_grad(), fx_config.patch(backed_size_oblivious=True):
            got = compiled(x)
            torch.testing.assert_close(got, plain(x), rtol=1e-5, atol=1e-5)
    assert compiler.stats.split_ops == 2 and compiler.stats.pieces == 3
    assert compiler.stats.compilations == 1 and compiler.stats.recompiles == 0
    assert dict(counters["graph_break"]) == {}
    assert is_split_op(torch.ops.cudagraph_engine.all_to_all.default)
