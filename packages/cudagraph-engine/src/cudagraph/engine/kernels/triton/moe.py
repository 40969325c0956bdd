"""Mixture-of-experts experts for the few tokens of a decode step as two Triton kernels: each token's top-k experts'
weight rows gathered by the router's expert ids on the device, read once as GEMVs, and weighted by the router's
weights, with no sorting, no grouping and no host sync.

``torch._grouped_mm`` (the ``grouped_mm`` expert computation of ``model.moe``) runs a grouped GEMM: for one token
and 8 of 128 experts, a tensor-core tile per expert of which one row is used. Here a decode step of ``T`` tokens is
``T * top_k`` GEMVs:

- ``gate_up``: a program owns one (token, expert slot) assignment and ``block_n`` columns of the expert's
  intermediate width: it reads those gate rows and up rows of the expert ``experts[t, slot]`` names, dots them with
  the token's row, and stores ``silu(gate) * up`` to a ``[T * top_k, I]`` scratch.
- ``down``: a program owns one token and ``block_n`` columns of the hidden size: for each of the token's experts it
  reads those rows of the expert's down projection, dots them with the slot's activation, and sums the products
  weighted by the router's weights in registers: the token's output, written once (no atomics, no zeroing launch,
  and the sum is in slot order whatever the scheduling: deterministic).

Experts outside ``[first_expert, first_expert + held)`` (another rank's, under expert sharding) add nothing: their
rows are never read. Numerics: loads in the model dtype, products in float32; gate and up, the activation and each
expert's output are rounded to the model dtype where the grouped path stores them, the weighted sum rounded once.
Grids depend on ``T`` and the shapes only and the expert ids are read on the device, so a launch is capturable in a
CUDA graph and replays for any routing. Under ``TRITON_INTERPRET=1`` the same kernels run on CPU tensors.

Cost: every assignment reads its expert's rows, so ``T`` tokens read ``T * top_k`` expert slices where a grouped
GEMM reads each distinct expert once; for few tokens that is the same bytes and far fewer wasted tile rows, for many
it is not. ``model.moe`` takes these kernels up to ``MOE_GEMV_MAX_TOKENS`` tokens and the grouped GEMM above
(``bench/bench_moe.py --sweep-crossover`` measures where the two cross).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from cudagraph.backend_utils import FastLauncher, cdiv, next_power_of_2

from .pdl import pdl_launch


@triton.jit
def _moe_gate_up_kernel(
    x_ptr,
    gate_up_ptr,
    experts_ptr,
    act_ptr,
    num_held,
    first_expert,
    width,
    x_stride,
    K: tl.constexpr,
    TOP_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    assignment = tl.program_id(0)
    columns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    token = assignment // TOP_K
    if PDL:
        # The expert id and the token's row come from the kernels before this one (router, norm), and the weights to
        # read follow from the id: everything waits.
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    expert = tl.load(experts_ptr + assignment).to(tl.int64) - first_expert
    held = (expert >= 0) & (expert < num_held)
    expert = tl.where(held, expert, 0)
    column_mask = columns < width
    row_mask = columns < tl.where(held, width, 0)  # an expert held elsewhere: no row read
    gate_rows = gate_up_ptr + expert * (2 * width * K) + columns.to(tl.int64)[:, None] * K
    up_rows = gate_rows + width * K
    gate = tl.zeros((BLOCK_N,), dtype=tl.float32)
    up = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        depth = start + tl.arange(0, BLOCK_K)
        depth_mask = depth < K
        x = tl.load(x_ptr + token * x_stride + depth, mask=depth_mask, other=0.0).to(tl.float32)[None, :]
        w_mask = row_mask[:, None] & depth_mask[None, :]
        gate += tl.sum(tl.load(gate_rows + depth[None, :], mask=w_mask, other=0.0).to(tl.float32) * x, axis=1)
        up += tl.sum(tl.load(up_rows + depth[None, :], mask=w_mask, other=0.0).to(tl.float32) * x, axis=1)
    dtype = act_ptr.dtype.element_ty
    gate = gate.to(dtype).to(tl.float32)
    up = up.to(dtype).to(tl.float32)
    activated = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32) * up
    tl.store(act_ptr + assignment * width + columns, activated.to(dtype), mask=column_mask)


@triton.jit
def _moe_down_kernel(
    act_ptr,
    down_ptr,
    experts_ptr,
    weights_ptr,
    out_ptr,
    num_held,
    first_expert,
    n,
    out_stride,
    WIDTH: tl.constexpr,
    TOP_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    token = tl.program_id(0)
    columns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    column_mask = columns < n
    dtype = out_ptr.dtype.element_ty
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for slot in tl.static_range(TOP_K):
        assignment = token * TOP_K + slot
        expert = tl.load(experts_ptr + assignment).to(tl.int64) - first_expert
        held = (expert >= 0) & (expert < num_held)
        expert = tl.where(held, expert, 0)
        weight = tl.load(weights_ptr + assignment).to(dtype).to(tl.float32)
        rows = down_ptr + expert * (n * WIDTH) + columns.to(tl.int64)[:, None] * WIDTH
        row_mask = columns < tl.where(held, n, 0)
        product = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for start in range(0, WIDTH, BLOCK_K):
            depth = start + tl.arange(0, BLOCK_K)
            depth_mask = depth < WIDTH
            activation = tl.load(act_ptr + assignment * WIDTH + depth, mask=depth_mask, other=0.0).to(tl.float32)
            w = tl.load(rows + depth[None, :], mask=row_mask[:, None] & depth_mask[None, :], other=0.0)
            product += tl.sum(w.to(tl.float32) * activation[None, :], axis=1)
        total += tl.where(held, product.to(dtype).to(tl.float32) * weight, 0.0)
    tl.store(out_ptr + token * out_stride + columns, total.to(dtype), mask=column_mask)


_LAUNCH_GATE_UP = FastLauncher(_moe_gate_up_kernel)
_LAUNCH_DOWN = FastLauncher(_moe_down_kernel)


@dataclass(frozen=True)
class MoeTile:
    """How one of the two kernels tiles its GEMVs: ``block_n`` output columns a program (for ``gate_up``: of gate and
    of up each), at most ``block_k`` of the reduction per loop step (``min(block_k, next_power_of_2(K))``), and the
    warps of a program."""

    block_n: int
    block_k: int
    num_warps: int = 4


@dataclass(frozen=True)
class MoeTiles:
    """The tiles of the ``gate_up`` and ``down`` kernels."""

    gate_up: MoeTile
    down: MoeTile


MOE_TILES = MoeTiles(gate_up=MoeTile(block_n=2, block_k=2048), down=MoeTile(block_n=4, block_k=256))
"""The tiles ``moe_experts`` uses, the fastest of ``bench/bench_moe.py --sweep-tiles`` at one token on an H200
(2026-11-29, Qwen3-30B-A3B's expert shapes, ``bench/results/2026-11-29-h200-bench_moe-crossover.json``): gate/up two
output rows a program over a reduction of 2048 (27.1 us a layer, against 30.3 for four rows over 1024); down four rows
over 256, Qwen3-30B-A3B's width 768 in three exact steps (29.8 us, the fastest of nine)."""

MOE_GEMV_MAX_TOKENS = 32
"""Tokens up to which ``model.moe`` computes the experts with these kernels (above: the grouped GEMM): the crossover
``bench/bench_moe.py --sweep-crossover`` measured on an H200 (the kernels win at every count up to 32, 426 against
459 us a layer at 32; the grouped GEMM from 48 on, 501 against 608 us)."""


def uses_moe_gemv(tokens: int) -> bool:
    """Whether a step of ``tokens`` tokens computes its experts with these kernels (``MOE_GEMV_MAX_TOKENS``)."""
    return tokens <= MOE_GEMV_MAX_TOKENS


def moe_experts(
    x: Tensor,
    weights: Tensor,
    experts: Tensor,
    gate_up_weight: Tensor,
    down_weight: Tensor,
    first_expert: int,
    *,
    tiles: MoeTiles = MOE_TILES,
) -> Tensor:
    """``[T, hidden]``: for each token of ``x`` ``[T, hidden]``, ``sum_slot weights[t, slot] * expert(x[t])`` over
    its experts ``experts[t, slot]`` (``[T, top_k]`` ids over all experts, ``weights`` ``[T, top_k]``), each expert a
    SwiGLU MLP of ``gate_up_weight`` ``[E, 2I, hidden]`` (gate rows then up rows) and ``down_weight`` ``[E, hidden,
    I]`` holding experts ``first_expert`` to ``first_expert + E - 1``; ids outside them add nothing. Two launches,
    no host sync; ``tiles`` are ``MOE_TILES`` unless a sweep passes others."""
    tokens, hidden = x.shape
    top_k = experts.shape[1]
    num_held, double_width, _ = gate_up_weight.shape
    width = double_width // 2
    if gate_up_weight.shape[2] != hidden or down_weight.shape != (num_held, hidden, width):
        raise ValueError(
            f"moe_experts needs gate_up_weight [E, 2I, {hidden}] and down_weight [E, {hidden}, I] of the same E and I, "
            f"got {tuple(gate_up_weight.shape)} and {tuple(down_weight.shape)}"
        )
    if weights.shape != experts.shape or experts.shape[0] != tokens:
        raise ValueError(
            f"moe_experts needs weights and experts of [{tokens}, top_k], got {tuple(weights.shape)} and "
            f"{tuple(experts.shape)}"
        )
    if x.stride(-1) != 1 or not gate_up_weight.is_contiguous() or not down_weight.is_contiguous():
        raise ValueError("moe_experts needs rows of x and both expert weights contiguous")
    out = torch.empty((tokens, hidden), dtype=x.dtype, device=x.device)
    if tokens == 0:
        return out
    experts, weights = experts.contiguous(), weights.contiguous()
    activations = torch.empty((tokens * top_k, width), dtype=x.dtype, device=x.device)
    pdl = pdl_launch(x.device)
    gate_up, down = tiles.gate_up, tiles.down
    _LAUNCH_GATE_UP(
        (tokens * top_k, cdiv(width, gate_up.block_n)),
        (x, gate_up_weight, experts, activations, num_held, first_expert, width, x.stride(0)),
        {
            "K": hidden, "TOP_K": top_k, "BLOCK_N": gate_up.block_n,
            "BLOCK_K": min(gate_up.block_k, next_power_of_2(hidden)), "PDL": pdl,
        },
        gate_up.num_warps,
        launch_pdl=pdl,
    )  # fmt: skip
    _LAUNCH_DOWN(
        (tokens, cdiv(hidden, down.block_n)),
        (activations, down_weight, experts, weights, out, num_held, first_expert, hidden, out.stride(0)),
        {
            "WIDTH": width, "TOP_K": top_k, "BLOCK_N": down.block_n,
            "BLOCK_K": min(down.block_k, next_power_of_2(width)), "PDL": pdl,
        },
        down.num_warps,
        launch_pdl=pdl,
    )  # fmt: skip
    return out
