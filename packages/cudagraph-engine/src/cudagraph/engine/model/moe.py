"""Sparse mixture-of-experts feed-forward (Qwen3-MoE, Mixtral): a router scores every expert for each token, the
token goes to its top-k experts (SwiGLU MLPs), and its output is the routing-weighted sum of theirs.

Nothing here syncs with the host or gives a tensor a shape that depends on the routing: every shape follows from the
token count alone, so a forward is captured whole by a CUDA graph and traced by ``torch.compile(fullgraph=True)``.
(That is why there is no ``nonzero``, no boolean-mask indexing and no ``bincount``: CUDA's ``bincount`` reads the
largest id back to the host to size its output.)

Three ways to compute the experts, picked by the first row of ``EXPERT_COMPUTES`` that applies to the device and dtype:

- ``triton_gemv``: for a step of at most ``kernels.triton.moe.MOE_GEMV_MAX_TOKENS`` tokens (a decode step), each
  token's top-k experts' weight rows gathered by the router's ids on the device and read once as GEMVs, in two Triton
  kernels (``kernels.triton.moe``); wider steps go to the next row that applies (``grouped_mm`` or ``dense``). CUDA,
  with Triton installed (CUDA builds of torch ship it). The choice by token count is made inside the custom op
  ``torch.ops.cudagraph_moe.gemv_experts`` where a forward is traced, so one compilation serves every bucket.
- ``grouped_mm``: the token-expert assignments sorted by expert, then one ``torch._grouped_mm`` for the gate/up
  projections and one for the down projection over the groups, whose ends come from a device-side ``searchsorted``.
  CUDA, bfloat16, on the GPUs where torch runs it as one kernel (compute capability 9.x and 10.x).
- ``dense``: every held expert runs on every token, as two batched matmuls, and a token's routing weights (zero for
  experts it does not use) pick and weigh the results. Valid on any device and dtype; the yardstick for the other.

Under tensor parallelism each rank holds a contiguous range of whole experts (``ShardPlan.experts``), routes every
token over all experts, computes its own experts' weighted outputs, and one all-reduce sums the ranks' parts; or,
given an ``ExpertExchange`` (``moe_a2a_backend="all_to_all"``), routes only its share of the tokens and exchanges
them with the experts' ranks (``moe_a2a``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .architecture import ModelConfig
from .collectives import all_reduced
from .moe_a2a import ExpertExchange, exchange_tokens, owned_tokens
from .parallel import RowRange


class Routing(NamedTuple):
    """Each token's chosen experts and their weights."""

    weights: torch.Tensor
    """``[T, top_k]`` float32: softmax probabilities of the chosen experts (renormalized to sum to 1 if asked)."""
    experts: torch.Tensor
    """``[T, top_k]`` int64: the chosen experts' ids, over all experts of the layer."""


def route(router_logits: torch.Tensor, top_k: int, normalize: bool) -> Routing:
    """The top-``top_k`` experts of each token from ``router_logits`` ``[T, num_experts]``: softmax in float32, top-k
    on the device, and with ``normalize`` the chosen probabilities divided by their sum."""
    probabilities = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probabilities, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return Routing(weights, experts)


def combine_matrix(routing: Routing, first_expert: int, num_held: int) -> torch.Tensor:
    """``[T, num_held]`` float32: token ``t``'s routing weight for held expert ``e`` (expert ``first_expert + e``),
    zero where the token does not use it. Experts held elsewhere land in a scratch column that is cut off."""
    held_ids = routing.experts - first_expert
    held = (held_ids >= 0) & (held_ids < num_held)
    columns = torch.where(held, held_ids, num_held)
    combine = routing.weights.new_zeros((routing.weights.shape[0], num_held + 1))
    return combine.scatter_add_(1, columns, routing.weights)[:, :num_held]


def dense_experts(
    x: torch.Tensor, routing: Routing, gate_up_weight: torch.Tensor, down_weight: torch.Tensor, first_expert: int
) -> torch.Tensor:
    """``[T, hidden]``: the routing-weighted sum of the held experts' outputs, every held expert run on every token
    (``gate_up_weight`` ``[E, 2I, H]``, ``down_weight`` ``[E, H, I]``: experts ``first_expert`` to ``first_expert +
    E - 1``)."""
    num_held = gate_up_weight.shape[0]
    combine = combine_matrix(routing, first_expert, num_held).to(x.dtype)
    # bmm over an expanded x, not a broadcasting matmul: that one special-cases a single token, so a compiled
    # forward would be traced again for T == 1.
    tokens = x.unsqueeze(0).expand(num_held, -1, -1)
    gate, up = torch.bmm(tokens, gate_up_weight.transpose(1, 2)).chunk(2, dim=-1)  # [E, T, I] each
    outputs = torch.bmm(F.silu(gate) * up, down_weight.transpose(1, 2))  # [E, T, H]
    return (outputs * combine.t().unsqueeze(-1)).sum(dim=0)


def grouped_experts(
    x: torch.Tensor, routing: Routing, gate_up_weight: torch.Tensor, down_weight: torch.Tensor, first_expert: int
) -> torch.Tensor:
    """``dense_experts``' result computing only the routed (token, expert) pairs: the ``T * top_k`` assignments
    sorted by held expert (those of other ranks' experts last), two ``torch._grouped_mm`` over the groups, and each
    token's weighted outputs summed back in its own row."""
    tokens, top_k = routing.experts.shape
    num_held = gate_up_weight.shape[0]
    held_ids = routing.experts.flatten() - first_expert
    held = (held_ids >= 0) & (held_ids < num_held)
    group_ids = torch.where(held, held_ids, num_held)
    order = torch.argsort(group_ids, stable=True)
    sorted_ids = group_ids.index_select(0, order)
    group_ends = torch.searchsorted(
        sorted_ids, torch.arange(1, num_held + 1, device=x.device, dtype=sorted_ids.dtype), out_int32=True
    )
    rows = x.index_select(0, order // top_k)
    gate, up = torch._grouped_mm(rows, gate_up_weight.transpose(1, 2), offs=group_ends).chunk(2, dim=-1)
    outputs = torch._grouped_mm(F.silu(gate) * up, down_weight.transpose(1, 2), offs=group_ends)
    # Rows past the last held group are never written by _grouped_mm (they may hold anything, NaN included).
    sorted_held = held.index_select(0, order).unsqueeze(-1)
    weights = routing.weights.flatten().index_select(0, order).to(x.dtype).unsqueeze(-1)
    weighted = torch.where(sorted_held, outputs * weights, 0)
    per_assignment = torch.empty_like(weighted).index_copy_(0, order, weighted)
    return per_assignment.view(tokens, top_k, -1).sum(dim=1)


ExpertsFn = Callable[[torch.Tensor, Routing, torch.Tensor, torch.Tensor, int], torch.Tensor]


def _runs_grouped_mm_fast(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch runs ``_grouped_mm`` here as one kernel: elsewhere it falls back to a per-group loop that
    reads the group ends back to the host, which a CUDA graph cannot capture."""
    if device.type != "cuda" or dtype != torch.bfloat16 or not hasattr(torch, "_grouped_mm"):
        return False
    return torch.cuda.get_device_capability(device)[0] in (9, 10)


@dataclass(frozen=True)
class ExpertCompute:
    """One way to compute the experts: ``compute`` where ``applies(device, dtype)``."""

    name: str
    compute: ExpertsFn
    applies: Callable[[torch.device, torch.dtype], bool]


WIDE_EXPERT_COMPUTES = (
    ExpertCompute("grouped_mm", grouped_experts, _runs_grouped_mm_fast),
    ExpertCompute("dense", dense_experts, lambda device, dtype: True),
)
"""Expert computations for steps of any width, best first; the last applies everywhere."""


def wide_experts(
    x: torch.Tensor, routing: Routing, gate_up_weight: torch.Tensor, down_weight: torch.Tensor, first_expert: int
) -> torch.Tensor:
    """The experts by the first row of ``WIDE_EXPERT_COMPUTES`` that applies to ``x``'s device and dtype."""
    compute = _first_wide_compute(x.device, x.dtype)
    return compute(x, routing, gate_up_weight, down_weight, first_expert)


@functools.cache
def _first_wide_compute(device: torch.device, dtype: torch.dtype) -> ExpertsFn:
    return next(row.compute for row in WIDE_EXPERT_COMPUTES if row.applies(device, dtype))


@functools.cache
def _triton_moe() -> ModuleType | None:
    """``kernels.triton.moe``, imported on first use (it imports Triton), or None where Triton is not installed."""
    try:
        from ..kernels.triton import moe
    except ModuleNotFoundError as error:
        if error.name is None or error.name.partition(".")[0] != "triton":
            raise
        return None
    return moe


def _runs_triton(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the Triton GEMV kernels run here: a CUDA device, with Triton installed."""
    return device.type == "cuda" and _triton_moe() is not None


def gemv_experts(
    x: torch.Tensor, routing: Routing, gate_up_weight: torch.Tensor, down_weight: torch.Tensor, first_expert: int
) -> torch.Tensor:
    """``dense_experts``' result: for a step of at most ``MOE_GEMV_MAX_TOKENS`` tokens the two Triton GEMV kernels of
    ``kernels.triton.moe`` (each assignment's expert rows read once, no sort, no host sync), for wider steps
    ``wide_experts``. A traced forward calls the custom op ``cudagraph_moe::gemv_experts`` in its place, which makes
    the same choice on the real tensors (the traced graph does not branch on the token count)."""
    moe = _triton_moe()
    if moe is not None and moe.uses_moe_gemv(x.shape[0]):
        return moe.moe_experts(x, routing.weights, routing.experts, gate_up_weight, down_weight, first_expert)
    return wide_experts(x, routing, gate_up_weight, down_weight, first_expert)


@torch.library.custom_op(
    "cudagraph_moe::gemv_experts",
    mutates_args=(),
    schema="(Tensor x, Tensor weights, Tensor experts, Tensor gate_up_weight, Tensor down_weight, int first_expert) "
    "-> Tensor",
)
def _gemv_experts_op(
    x: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    gate_up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    first_expert: int,
) -> torch.Tensor:
    return gemv_experts(x, Routing(weights, experts), gate_up_weight, down_weight, first_expert)


@_gemv_experts_op.register_fake
def _(
    x: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    gate_up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    first_expert: int,
) -> torch.Tensor:
    return x.new_empty((x.shape[0], down_weight.shape[1]))


@torch._dynamo.substitute_in_graph(gemv_experts)
def _traced_gemv_experts(
    x: torch.Tensor, routing: Routing, gate_up_weight: torch.Tensor, down_weight: torch.Tensor, first_expert: int
) -> torch.Tensor:
    return torch.ops.cudagraph_moe.gemv_experts(
        x, routing.weights, routing.experts, gate_up_weight, down_weight, first_expert
    )


EXPERT_COMPUTES = (ExpertCompute("triton_gemv", gemv_experts, _runs_triton), *WIDE_EXPERT_COMPUTES)
"""Expert computations, best first; the last applies everywhere."""

EXPERT_COMPUTES_BY_NAME = {compute.name: compute for compute in EXPERT_COMPUTES}


def choose_expert_compute(device: torch.device, dtype: torch.dtype) -> ExpertCompute:
    """The first row of ``EXPERT_COMPUTES`` that applies to ``device`` and ``dtype``."""
    return next(compute for compute in EXPERT_COMPUTES if compute.applies(device, dtype))


def _parameter(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class SparseMoE(nn.Module):
    """A sparse mixture-of-experts feed-forward block: router, top-k routing, SwiGLU experts, weighted sum (and
    under tensor parallelism the all-reduce of the ranks' partial sums over ``reduce_group``).

    ``router_weight`` ``[num_experts, hidden]`` scores all experts; ``gate_up_weight`` ``[E, 2 * I, hidden]`` (gate
    rows, then up rows) and ``down_weight`` ``[E, hidden, I]`` hold the ``E`` experts of ``experts`` (all of them by
    default). ``expert_compute`` is chosen from ``EXPERT_COMPUTES`` for the device and dtype; assign another row of
    it to compare the two. With an ``exchange`` the tokens travel to the experts' ranks and back (no all-reduce).
    """

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        reduce_group: str | None = None,
        experts: RowRange | None = None,
        exchange: ExpertExchange | None = None,
    ) -> None:
        super().__init__()
        held = experts or RowRange(0, config.num_experts)
        if exchange is not None:
            exchange.check_dtype(dtype)
        self.exchange = exchange
        self.reduce_group = reduce_group
        self.first_expert = held.start
        self.top_k = config.num_experts_per_tok
        self.normalize = config.norm_topk_prob
        width, hidden = config.moe_intermediate_size, config.hidden_size
        self.router_weight = _parameter((config.num_experts, hidden), dtype, device)
        self.gate_up_weight = _parameter((held.size, 2 * width, hidden), dtype, device)
        self.down_weight = _parameter((held.size, hidden, width), dtype, device)
        self.expert_compute = choose_expert_compute(torch.device(device), dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output ``[T, hidden]`` for the normed ``x`` ``[T, hidden]`` (the caller adds it to the
        residual stream)."""
        if self.exchange is not None:
            mine = owned_tokens(x, self.exchange)
            routing = route(F.linear(mine, self.router_weight), self.top_k, self.normalize)
            return exchange_tokens(mine, *routing, x.shape[0], self.exchange, self.held_outputs)
        routing = route(F.linear(x, self.router_weight), self.top_k, self.normalize)
        out = self.expert_compute.compute(x, routing, self.gate_up_weight, self.down_weight, self.first_expert)
        return out if self.reduce_group is None else all_reduced(out, self.reduce_group)

    def held_outputs(self, rows: torch.Tensor, local_ids: torch.Tensor) -> torch.Tensor:
        """``[R, hidden]``: each of ``rows`` through the held expert ``local_ids`` names (counted from this rank's
        first), unweighted; zeros for ids past the held experts (empty slots of an exchange)."""
        ones = torch.ones((rows.shape[0], 1), dtype=torch.float32, device=rows.device)
        routing = Routing(ones, local_ids.unsqueeze(1))
        return self.expert_compute.compute(rows, routing, self.gate_up_weight, self.down_weight, 0)
