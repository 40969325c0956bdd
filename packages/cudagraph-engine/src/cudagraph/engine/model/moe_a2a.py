"""Expert parallel by token exchange (``moe_a2a_backend="all_to_all"``): a sparse block whose experts are split over
the ranks sends each token to the ranks holding its experts and gets their outputs back, instead of every rank
computing its experts for every token and all-reducing.

Under tensor parallelism every rank holds the same ``T`` tokens. With ``N`` ranks, ``S = ceil(T / N)`` and the
tokens padded to ``N * S``, rank ``r`` owns tokens ``[r * S, (r + 1) * S)``:

1. route: its ``S`` tokens are routed (``S * top_k`` assignments; those of padding tokens are empty);
2. dispatch: every assignment takes a slot in the block of the rank holding its expert, in a send buffer
   ``[N, C, H + 1]`` (``C = S * top_k``: room for all of them going to one rank). The slot is the assignment's
   place among those going to the same rank: a cumulative sum over a comparison with the rank ids, on the device.
   The last column carries the expert's id on that rank as a float (an empty slot carries ``experts_per_rank``,
   which no expert matches); one ``all_to_all`` sends the blocks;
3. experts: each rank runs its experts over the ``N * C`` rows it received (``SparseMoE``'s dense or grouped
   computation; empty rows give zeros) and one ``all_to_all`` sends the outputs back into the same slots;
4. combine: the owner picks each assignment's slot, weighs it by the routing weight and sums a token's ``top_k``;
   an ``all_gather`` rebuilds ``[T, H]`` on every rank.

Every shape follows from ``T`` and ``N``: no ``nonzero``, no boolean indexing, no host read, so a full graph
captures the block and dynamo traces it whole. The ``all_to_all`` is a registered split op: a breakable capture
breaks there and ``tc_piecewise`` splits there. The pieces (``plan_dispatch``, ``pack``, ``unpack``, ``combine``)
take no process group, so a test can run ``N`` ranks in one process with a block transpose for the all-to-all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from cudagraph.backend_utils import cdiv

from .collectives import all_gather, all_to_all

HeldOutputsFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(rows [R, H], local_ids [R]) -> [R, H]``: each row through this rank's expert its id names, unweighted (zeros
for the empty id)."""


@dataclass(frozen=True)
class ExpertExchange:
    """Where a sparse block's tokens travel: rank ``rank`` of ``world_size`` over the process group ``group_name``,
    every rank holding ``experts_per_rank`` experts (rank ``r`` experts ``[r * experts_per_rank, (r + 1) *
    experts_per_rank)``)."""

    group_name: str
    rank: int
    world_size: int
    experts_per_rank: int

    def check_dtype(self, dtype: torch.dtype) -> None:
        """Raise ``ValueError`` when ``dtype`` cannot carry every local expert id (and the empty id) exactly: the ids
        travel as floats in the activations' last column."""
        largest = exact_integer_limit(dtype)
        if self.experts_per_rank > largest:
            raise ValueError(
                f"moe_a2a_backend 'all_to_all' sends expert ids as {dtype} values, exact up to {largest}; "
                f"{self.experts_per_rank} experts per rank need more: use float32 or more ranks"
            )


def exact_integer_limit(dtype: torch.dtype) -> int:
    """The largest ``n`` such that ``0..n`` are all exact in the floating ``dtype`` (256 in bfloat16)."""
    return int(2 / torch.finfo(dtype).eps)


class DispatchPlan(NamedTuple):
    """Where one rank's ``S * top_k`` assignments go (token-major: token ``s``'s ``j``-th expert is ``s * top_k +
    j``)."""

    slots: torch.Tensor
    """``[S * top_k]`` int64: the row of the flattened send buffer ``[(N + 1) * C]``; block ``N`` (never sent) holds
    the empty assignments of padding tokens."""
    local_experts: torch.Tensor
    """``[S * top_k]`` int64: the expert's id on the rank that holds it (``experts_per_rank`` where empty)."""
    weights: torch.Tensor
    """``[S * top_k]`` float32: the routing weights, zero where empty."""


def plan_dispatch(
    weights: torch.Tensor,
    experts: torch.Tensor,
    first_token: int,
    tokens: int,
    world_size: int,
    experts_per_rank: int,
) -> DispatchPlan:
    """The dispatch of one rank's tokens ``[first_token, first_token + S)`` (routing ``weights`` and global
    ``experts``, ``[S, top_k]``) over ``world_size`` ranks; rows at or past ``tokens`` are padding, sent nowhere."""
    owned, top_k = experts.shape
    capacity = owned * top_k
    real = torch.arange(first_token, first_token + owned, device=experts.device) < tokens
    real = real.unsqueeze(1).expand(owned, top_k).flatten()
    experts = experts.flatten()
    destination = torch.where(real, experts // experts_per_rank, world_size)
    ranks = torch.arange(world_size + 1, device=experts.device)
    # An assignment's place among those going to the same rank: how many before it (itself included) go there.
    places = torch.cumsum(destination.unsqueeze(1) == ranks, dim=0).gather(1, destination.unsqueeze(1)).squeeze(1)
    slots = destination * capacity + places - 1
    local = torch.where(real, experts % experts_per_rank, experts_per_rank)
    return DispatchPlan(slots, local, torch.where(real, weights.flatten(), 0.0))


def pack(x: torch.Tensor, plan: DispatchPlan, world_size: int, top_k: int, experts_per_rank: int) -> torch.Tensor:
    """The send buffer ``[N, C, H + 1]`` of one rank's tokens ``x`` ``[S, H]``: each assignment's token row at its
    slot with its local expert id (as a float) in the last column; empty slots are zero rows with the empty id."""
    owned, hidden = x.shape
    capacity = owned * top_k
    rows = x.unsqueeze(1).expand(owned, top_k, hidden).reshape(capacity, hidden)
    sent_rows = x.new_zeros(((world_size + 1) * capacity, hidden)).index_copy_(0, plan.slots, rows)
    ids = x.new_full(((world_size + 1) * capacity,), float(experts_per_rank))
    sent_ids = ids.index_copy_(0, plan.slots, plan.local_experts.to(x.dtype))
    packed = torch.cat([sent_rows, sent_ids.unsqueeze(1)], dim=1)
    return packed[: world_size * capacity].view(world_size, capacity, hidden + 1)


def unpack(received: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows ``[N * C, H]`` and local expert ids ``[N * C]`` (int64) of a received buffer ``[N, C, H + 1]``."""
    flat = received.flatten(0, 1)
    return flat[:, :-1], flat[:, -1].round().to(torch.int64)


def combine(returned: torch.Tensor, plan: DispatchPlan, top_k: int) -> torch.Tensor:
    """One rank's block output ``[S, H]`` from the expert outputs sent back ``[N, C, H]`` (in the slots its
    assignments were sent to): each assignment's output weighted, a token's ``top_k`` summed."""
    world_size, capacity, hidden = returned.shape
    # A block of zeros after the returned ones: the slots of empty assignments.
    outputs = torch.cat([returned.reshape(world_size * capacity, hidden), returned.new_zeros((capacity, hidden))])
    picked = outputs.index_select(0, plan.slots) * plan.weights.to(returned.dtype).unsqueeze(1)
    return picked.view(capacity // top_k, top_k, hidden).sum(dim=1)


def owned_tokens(x: torch.Tensor, exchange: ExpertExchange) -> torch.Tensor:
    """This rank's tokens ``[S, H]`` of the replicated ``x`` ``[T, H]`` (zero rows past ``T``)."""
    tokens = x.shape[0]
    owned = cdiv(tokens, exchange.world_size)  # S: the tokens padded up to a multiple of the ranks, split evenly
    first = exchange.rank * owned
    return F.pad(x, (0, 0, 0, exchange.world_size * owned - tokens))[first : first + owned]


def exchange_tokens(
    mine: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    tokens: int,
    exchange: ExpertExchange,
    held_outputs: HeldOutputsFn,
) -> torch.Tensor:
    """The sparse block's output ``[T, H]`` on every rank of ``exchange``, from this rank's tokens ``mine``
    ``[S, H]`` (``owned_tokens``) and their routing (``weights`` and global ``experts``, ``[S, top_k]``): dispatch,
    run the held experts (``held_outputs``), send back, combine, gather."""
    world_size, top_k = exchange.world_size, experts.shape[1]
    first = exchange.rank * mine.shape[0]
    plan = plan_dispatch(weights, experts, first, tokens, world_size, exchange.experts_per_rank)
    received = all_to_all(pack(mine, plan, world_size, top_k, exchange.experts_per_rank), exchange.group_name)
    rows, local_ids = unpack(received)
    outputs = held_outputs(rows, local_ids).view(received.shape[0], received.shape[1], mine.shape[1])
    returned = all_to_all(outputs, exchange.group_name)
    gathered = all_gather(combine(returned, plan, top_k), exchange.group_name)  # [N, S, H]
    return gathered.flatten(0, 1)[:tokens]
