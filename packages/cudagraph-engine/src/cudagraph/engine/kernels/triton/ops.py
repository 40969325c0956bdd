"""The decoder layer's fused operations as Triton kernels, and the launchers that size them (``layer_set`` wraps
them into a kernel set).

Five kernels, each one launch whatever the batch:

- ``rms_norm`` and ``add_rms_norm``: a row per program; the residual sum is rounded to the model dtype before its
  norm (as the torch reference rounds it) and written back in place (or, for a forward that must not mutate its
  inputs, into new tensors: ``add_rms_norm_into``).
- ``qk_norm_rope``: Qwen3's per-head norms of q and k (each head by its row of the weight) and rotary of q and k
  from the positions, in place in the fused projection (or into a tensor of their own): three launches of the other
  sets in one.
- ``gemv``: ``x @ weight.T`` (+ bias) for the few rows of a decode step, without split-K: a program owns
  ``block_n`` output columns and reads their weight rows once, so there is no reduction kernel after it (cuBLAS
  adds one to most of these shapes); with ``silu_mul`` the input row is ``silu(gate) * up`` computed on load, which
  fuses the activation into the down projection; ``add_norm_gemv`` norms ``x + residual`` on load, which fuses the
  residual add and the RMSNorm into the projection after them (q/k/v, gate/up).
- ``silu_and_mul`` for the steps too wide for ``gemv``.

PDL: each kernel takes a ``PDL`` constexpr and each launcher asks ``pdl.pdl_launch`` for the tensors' device; under
it a kernel reads only weights (the norm's vector, the GEMV's first weight tile) before ``gdc_wait()``.

Numerics: every kernel loads in the model dtype, computes in float32 and rounds once per value it stores; the
normed heads are rounded to the model dtype before rotary, and the activation before the projection, where the
unfused path stores them. Nothing syncs with the host and every grid is a function of shapes only, so each launch
is capturable in a CUDA graph. Under ``TRITON_INTERPRET=1`` the same kernels run on CPU tensors (the CPU tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from cudagraph.backend_utils import FastLauncher, cdiv, next_power_of_2

from .pdl import pdl_launch


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    sum_ptr,
    width,
    x_stride,
    residual_stride,
    out_stride,
    sum_stride,
    eps,
    ADD: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < width
    weight = tl.load(weight_ptr + offsets, mask=mask, other=0.0).to(tl.float32)  # a weight: before the wait
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    x = tl.load(x_ptr + row * x_stride + offsets, mask=mask, other=0.0)
    if ADD:
        residual_row = residual_ptr + row * residual_stride + offsets
        total = (x.to(tl.float32) + tl.load(residual_row, mask=mask, other=0.0).to(tl.float32)).to(x.dtype)
        tl.store(sum_ptr + row * sum_stride + offsets, total, mask=mask)
        x = total
    values = x.to(tl.float32)
    inverse_rms = tl.rsqrt(tl.sum(values * values, axis=0) / width + eps)
    tl.store(out_ptr + row * out_stride + offsets, (values * inverse_rms * weight).to(x.dtype), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(
    heads_ptr,
    row_stride,
    out_ptr,
    out_row_stride,
    norm_weight_ptr,
    cos_sin_ptr,
    cos_sin_stride,
    positions_ptr,
    kv_ptr,
    slots_ptr,
    num_q_heads,
    num_k_heads,
    eps,
    HEAD_DIM: tl.constexpr,
    HALF_BLOCK: tl.constexpr,
    HEADS_BLOCK: tl.constexpr,
    NORM: tl.constexpr,
    STORE: tl.constexpr,
    COPY_V: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    token = tl.program_id(0)
    heads = tl.program_id(1) * HEADS_BLOCK + tl.arange(0, HEADS_BLOCK)
    dims = tl.arange(0, HALF_BLOCK)
    half = HEAD_DIM // 2
    dim_mask = dims < half
    rotated = heads < num_q_heads + num_k_heads
    is_v = (heads >= num_q_heads + num_k_heads) & (heads < num_q_heads + 2 * num_k_heads)
    read = (rotated | is_v) if (STORE or COPY_V) else rotated
    mask = read[:, None] & dim_mask[None, :]
    first = heads_ptr + token * row_stride + heads[:, None] * HEAD_DIM + dims[None, :]
    x1 = tl.load(first, mask=mask, other=0.0)
    x2 = tl.load(first + half, mask=mask, other=0.0)
    dtype = x1.dtype
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    if NORM:
        inverse_rms = tl.rsqrt((tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1)) / HEAD_DIM + eps)[:, None]
        weight_row = norm_weight_ptr + heads[:, None] * HEAD_DIM + dims[None, :]
        weight_mask = rotated[:, None] & dim_mask[None, :]
        a = (a * inverse_rms * tl.load(weight_row, mask=weight_mask, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
        b = (
            (b * inverse_rms * tl.load(weight_row + half, mask=weight_mask, other=0.0).to(tl.float32))
            .to(dtype)
            .to(tl.float32)
        )
    position = tl.load(positions_ptr + token)
    cos = tl.load(cos_sin_ptr + position * cos_sin_stride + dims, mask=dim_mask, other=0.0)[None, :]
    sin = tl.load(cos_sin_ptr + position * cos_sin_stride + half + dims, mask=dim_mask, other=0.0)[None, :]
    out1 = (a * cos - b * sin).to(dtype)
    out2 = (b * cos + a * sin).to(dtype)
    out_first = out_ptr + token * out_row_stride + heads[:, None] * HEAD_DIM + dims[None, :]
    if COPY_V:
        # The v heads follow the rotated k heads in ``out`` as read, so keys and values sit side by side there.
        write_back = (rotated | is_v)[:, None] & dim_mask[None, :]
        tl.store(out_first, tl.where(is_v[:, None], x1, out1), mask=write_back)
        tl.store(out_first + half, tl.where(is_v[:, None], x2, out2), mask=write_back)
    else:
        write_back = rotated[:, None] & dim_mask[None, :]
        tl.store(out_first, out1, mask=write_back)
        tl.store(out_first + half, out2, mask=write_back)
    if STORE:
        # A slot's cache row is [2, num_k_heads, HEAD_DIM], keys then values: the k and v heads of the projection in
        # their order. Keys go in rotated, values as read.
        is_k = rotated & (heads >= num_q_heads)
        slot = tl.load(slots_ptr + token).to(tl.int64)
        cache = kv_ptr + slot * (2 * num_k_heads * HEAD_DIM) + (heads - num_q_heads)[:, None] * HEAD_DIM + dims[None, :]
        store_mask = (is_k | is_v)[:, None] & dim_mask[None, :]
        v_rows = is_v[:, None]
        tl.store(cache, tl.where(v_rows, x1, out1), mask=store_mask)
        tl.store(cache + half, tl.where(v_rows, x2, out2), mask=store_mask)


@triton.jit
def _gemv_accumulate(
    accumulator,
    w,
    start,
    x_ptr,
    x_stride,
    rows,
    row_mask,
    residual_ptr,
    residual_stride,
    norm_weight_ptr,
    inverse_rms,
    K: tl.constexpr,
    SILU_MUL: tl.constexpr,
    ADD_NORM: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``accumulator`` plus the products of the weight tile ``w`` (reduction ``start`` to ``start + BLOCK_K``) with
    the input rows there, computed on load (``silu(gate) * up``, or the normed ``x + residual``)."""
    depth = start + tl.arange(0, BLOCK_K)
    depth_mask = depth < K
    x_mask = row_mask[:, None] & depth_mask[None, :]
    x_row = x_ptr + rows[:, None] * x_stride + depth[None, :]
    x = tl.load(x_row, mask=x_mask, other=0.0)
    if SILU_MUL:
        gate = x.to(tl.float32)
        up = tl.load(x_row + K, mask=x_mask, other=0.0).to(tl.float32)
        x = (gate / (1.0 + tl.exp(-gate)) * up).to(x.dtype)
    if ADD_NORM:
        stream = tl.load(residual_ptr + rows[:, None] * residual_stride + depth[None, :], mask=x_mask, other=0.0)
        total = (x.to(tl.float32) + stream.to(tl.float32)).to(x.dtype).to(tl.float32)
        scale = tl.load(norm_weight_ptr + depth, mask=depth_mask, other=0.0).to(tl.float32)
        x = (total * inverse_rms[:, None] * scale[None, :]).to(x.dtype)
    return accumulator + tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)


@triton.jit
def _gemv_kernel(
    x_ptr,
    weight_ptr,
    bias_ptr,
    out_ptr,
    residual_ptr,
    norm_weight_ptr,
    new_residual_ptr,
    num_rows,
    n,
    x_stride,
    out_stride,
    residual_stride,
    eps,
    K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU_MUL: tl.constexpr,
    ADD_NORM: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    columns = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_T)
    column_mask = columns < n
    row_mask = rows < num_rows
    # The first weight tile (all of it where the reduction fits one step) is read before anything the kernels
    # before this one write: under PDL that read overlaps their tail.
    weight_rows = weight_ptr + columns[:, None] * K
    first_depth = tl.arange(0, BLOCK_K)
    w_first = tl.load(
        weight_rows + first_depth[None, :], mask=column_mask[:, None] & (first_depth < K)[None, :], other=0.0
    )
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    inverse_rms = tl.full((BLOCK_T,), 1.0, dtype=tl.float32)
    if ADD_NORM:
        # Every program norms the whole input row itself (from L2: a few KiB against its weight rows), so the norm
        # needs no launch of its own; the first program also writes the summed stream, out of place, since the
        # other programs still read the old one.
        squares = tl.zeros((BLOCK_T,), dtype=tl.float32)
        for start in range(0, K, BLOCK_K):
            depth = start + tl.arange(0, BLOCK_K)
            x_mask = row_mask[:, None] & (depth < K)[None, :]
            x = tl.load(x_ptr + rows[:, None] * x_stride + depth[None, :], mask=x_mask, other=0.0)
            stream = tl.load(residual_ptr + rows[:, None] * residual_stride + depth[None, :], mask=x_mask, other=0.0)
            total = (x.to(tl.float32) + stream.to(tl.float32)).to(x.dtype)
            if tl.program_id(0) == 0:
                tl.store(new_residual_ptr + rows[:, None] * K + depth[None, :], total, mask=x_mask)
            squares += tl.sum(total.to(tl.float32) * total.to(tl.float32), axis=1)
        inverse_rms = tl.rsqrt(squares / K + eps)
    accumulator = _gemv_accumulate(
        tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32), w_first, 0, x_ptr, x_stride, rows, row_mask, residual_ptr,
        residual_stride, norm_weight_ptr, inverse_rms, K, SILU_MUL, ADD_NORM, BLOCK_K,
    )  # fmt: skip
    for start in range(BLOCK_K, K, BLOCK_K):
        depth = start + tl.arange(0, BLOCK_K)
        w = tl.load(weight_rows + depth[None, :], mask=column_mask[:, None] & (depth < K)[None, :], other=0.0)
        accumulator = _gemv_accumulate(
            accumulator, w, start, x_ptr, x_stride, rows, row_mask, residual_ptr, residual_stride, norm_weight_ptr,
            inverse_rms, K, SILU_MUL, ADD_NORM, BLOCK_K,
        )  # fmt: skip
    if HAS_BIAS:
        accumulator += tl.load(bias_ptr + columns, mask=column_mask, other=0.0).to(tl.float32)[None, :]
    out_mask = row_mask[:, None] & column_mask[None, :]
    out_row = out_ptr + rows[:, None] * out_stride + columns[None, :]
    tl.store(out_row, accumulator.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _silu_and_mul_kernel(gate_up_ptr, out_ptr, width, in_stride, out_stride, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0)
    columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = columns < width
    gate_row = gate_up_ptr + row * in_stride + columns
    gate = tl.load(gate_row, mask=mask, other=0.0)
    up = tl.load(gate_row + width, mask=mask, other=0.0).to(tl.float32)
    values = gate.to(tl.float32)
    tl.store(out_ptr + row * out_stride + columns, (values / (1.0 + tl.exp(-values)) * up).to(gate.dtype), mask=mask)


_LAUNCH_RMS_NORM = FastLauncher(_rms_norm_kernel)
_LAUNCH_QK_NORM_ROPE = FastLauncher(_qk_norm_rope_kernel)
_LAUNCH_GEMV = FastLauncher(_gemv_kernel)
_LAUNCH_SILU_AND_MUL = FastLauncher(_silu_and_mul_kernel)
"""Each kernel's launcher: Triton's JIT work done once per specialization, not once per launch
(``cudagraph.backend_utils.FastLauncher``)."""


@dataclass(frozen=True)
class GemvTile:
    """How ``gemv`` tiles a step of up to ``max_rows`` rows: ``block_n`` output columns a program, at most
    ``block_k`` of the reduction per loop step (a reduction of ``K`` takes ``min(block_k, next_power_of_2(K))``, so
    one that fits is read in a single step; the register tile is ``rows x block_n x`` that), and its warps."""

    max_rows: int
    block_n: int
    block_k: int
    num_warps: int = 4


GEMV_TILES = (
    GemvTile(max_rows=1, block_n=4, block_k=4096),
    GemvTile(max_rows=2, block_n=4, block_k=1024),
)
"""By step rows, smallest first: the first tile whose ``max_rows`` covers a step is used. Wider steps go to the
dense matmul (``gemv_tile`` returns None). Chosen by ``bench/bench_kernels.py --sweep`` on an H100 (Qwen3-0.6B's
projections, bfloat16): at one row, reading the whole reduction in one step was the fastest tile of every
projection (o: 2.73 against 3.19 us with 1024 a step; down: 3.73 against 4.31 us), and it beats cuBLAS 1.2-2.1x
on each; at four rows cuBLAS's tensor-core kernels win the wide projections."""

HEADS_PER_PROGRAM = 8
"""Heads a ``qk_norm_rope`` program rotates (a token's q and k heads split over a few programs)."""

ELEMENTWISE_BLOCK = 1024
"""Columns a ``silu_and_mul`` program computes."""


def gemv_tile(rows: int) -> GemvTile | None:
    """The tile for a step of ``rows`` rows, or None when ``rows`` is past the last tile (use a dense matmul)."""
    return next((tile for tile in GEMV_TILES if rows <= tile.max_rows), None)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of ``x`` ``[T, W]`` scaled by ``weight`` ``[W]``, into a new tensor."""
    out = torch.empty_like(x)
    _launch_norm(x, None, weight, out, eps)
    return out


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual += x`` (rounded), then ``x = rms_norm(residual)``: both in place, one launch."""
    _launch_norm(x, residual, weight, x, eps, residual)
    return x, residual


def add_rms_norm_into(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)`` into two new tensors, one launch: ``add_rms_norm`` for a caller
    whose inputs must stay as they are (a custom op that declares no mutation)."""
    normed = torch.empty_like(x, memory_format=torch.contiguous_format)
    total = torch.empty_like(x, memory_format=torch.contiguous_format)
    _launch_norm(x, residual, weight, normed, eps, total)
    return normed, total


def _launch_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    out: torch.Tensor,
    eps: float,
    total: torch.Tensor | None = None,
) -> None:
    """One norm launch; with ``residual`` the sum ``x + residual`` is normed and stored to ``total``."""
    rows, width = x.shape
    if rows == 0:
        return
    residual_stride = 0 if residual is None else residual.stride(0)
    total_stride = 0 if total is None else total.stride(0)
    pdl = pdl_launch(x.device)
    _LAUNCH_RMS_NORM(
        (rows,),
        (
            x, x if residual is None else residual, weight, out, out if total is None else total, width,
            x.stride(0), residual_stride, out.stride(0), total_stride, eps,
        ),
        {"ADD": residual is not None, "BLOCK": next_power_of_2(width), "PDL": pdl},
        launch_pdl=pdl,
    )  # fmt: skip


def qk_norm_rope(
    heads: torch.Tensor,
    norm_weight: torch.Tensor | None,
    num_q_heads: int,
    num_k_heads: int,
    eps: float,
    cos_sin: torch.Tensor,
    positions: torch.Tensor,
    kv_store: tuple[torch.Tensor, torch.Tensor] | None = None,
    out: torch.Tensor | None = None,
) -> None:
    """In place on the q then k heads at the front of ``heads`` ``[T, H, D]`` (each row's heads contiguous): each
    head normed by its row of ``norm_weight`` ``[Hq + Hk, D]`` (skipped when None), then rotated (Neox halves) by
    the float32 ``cos_sin`` ``[positions, D]`` row (cos then sin halves) at ``positions[t]``. With ``out``
    ``[T, Hq + Hk, D]`` (each row's heads contiguous) the rotated heads go there instead and ``heads`` is only read;
    with ``out`` ``[T, Hq + 2 Hk, D]`` the v heads (the ``Hk`` after the k heads) are copied after them as read, in
    the same launch, so that keys and values sit side by side in ``out``.

    With ``kv_store = (kv_buffer, slots)`` the same launch also writes each token's rotated keys and its values (the
    ``Hk`` heads after the k heads) to row ``slots[t]`` of ``kv_buffer`` ``[slots, 2, Hk, D]`` (keys, then values:
    a ``TokenToKVPool`` layer)."""
    tokens, _, head_dim = heads.shape
    if tokens == 0:
        return
    if heads.stride(2) != 1 or heads.stride(1) != head_dim:
        raise ValueError(f"qk_norm_rope needs each row's heads contiguous, got strides {heads.stride()}")
    kv_buffer, slots = kv_store if kv_store is not None else (heads, positions)
    if kv_store is not None and (kv_buffer.shape[1:] != (2, num_k_heads, head_dim) or not kv_buffer.is_contiguous()):
        raise ValueError(
            f"qk_norm_rope stores into a contiguous [slots, 2, {num_k_heads}, {head_dim}] buffer, got "
            f"{tuple(kv_buffer.shape)}"
        )
    if out is None:
        out = heads
    out_heads = (num_q_heads + num_k_heads, num_q_heads + 2 * num_k_heads)
    copy_v = out is not heads and out.shape[1:2] == (out_heads[1],)
    if out is not heads and (
        out.shape[0] != tokens or out.shape[1] not in out_heads or out.shape[2] != head_dim
        or out.stride(2) != 1 or out.stride(1) != head_dim
    ):  # fmt: skip
        raise ValueError(
            f"qk_norm_rope writes into [{tokens}, {out_heads[0]} or {out_heads[1]}, {head_dim}] with each row's heads "
            f"contiguous, got {tuple(out.shape)} of strides {out.stride()}"
        )
    launched_heads = num_q_heads + (2 if kv_store is not None or copy_v else 1) * num_k_heads
    grid = (tokens, cdiv(launched_heads, HEADS_PER_PROGRAM))
    pdl = pdl_launch(heads.device)
    _LAUNCH_QK_NORM_ROPE(
        grid,
        (
            heads, heads.stride(0), out, out.stride(0), heads if norm_weight is None else norm_weight, cos_sin,
            cos_sin.stride(0),
            positions, kv_buffer, slots, num_q_heads, num_k_heads, eps,
        ),
        {
            "HEAD_DIM": head_dim, "HALF_BLOCK": next_power_of_2(head_dim // 2), "HEADS_BLOCK": HEADS_PER_PROGRAM,
            "NORM": norm_weight is not None, "STORE": kv_store is not None, "COPY_V": copy_v, "PDL": pdl,
        },
        launch_pdl=pdl,
    )  # fmt: skip


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    silu_mul: bool = False,
    tile: GemvTile | None = None,
) -> torch.Tensor:
    """``x @ weight.T + bias`` for ``x`` ``[T, K]`` and ``weight`` ``[N, K]`` (contiguous), T within
    ``GEMV_TILES``; with ``silu_mul`` ``x`` is ``[T, 2K]`` (gate then up) and its row ``silu(gate) * up``.
    ``tile`` is the table's by default (a caller that looked it up passes it; the sweep of ``bench/bench_kernels.py``
    passes others)."""
    rows = x.shape[0]
    n, k = weight.shape
    tile = tile or gemv_tile(rows)
    if tile is None:
        raise ValueError(f"gemv covers steps of at most {GEMV_TILES[-1].max_rows} rows, got {rows}")
    columns = 2 * k if silu_mul else k
    if x.shape[1] != columns:
        layout = " (gate then up)" if silu_mul else ""
        raise ValueError(f"gemv of weight {tuple(weight.shape)} needs x of {columns} columns{layout}, got {x.shape[1]}")
    if x.stride(-1) != 1 or not weight.is_contiguous():
        raise ValueError("gemv needs rows of x and weight contiguous")
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows:
        _launch_gemv(x, weight, bias, out, None, tile, silu_mul=silu_mul)
    return out


def add_norm_gemv(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    tile: GemvTile | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gemv(rms_norm(x + residual)), x + residual)`` in one launch, for ``x`` and ``residual`` ``[T, K]`` (the
    sum rounded, as ``add_rms_norm`` rounds it, into a new tensor: ``x`` and ``residual`` are left as they are)."""
    rows = x.shape[0]
    n, k = weight.shape
    tile = tile or gemv_tile(rows)
    if tile is None:
        raise ValueError(f"add_norm_gemv covers steps of at most {GEMV_TILES[-1].max_rows} rows, got {rows}")
    if x.shape != residual.shape or x.shape[1] != k or norm_weight.shape != (k,):
        raise ValueError(
            f"add_norm_gemv of weight {tuple(weight.shape)} needs x and residual of {k} columns and a norm weight "
            f"of {k}, got {tuple(x.shape)}, {tuple(residual.shape)} and {tuple(norm_weight.shape)}"
        )
    if x.stride(-1) != 1 or residual.stride(-1) != 1 or not weight.is_contiguous():
        raise ValueError("add_norm_gemv needs rows of x, residual and weight contiguous")
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    total = torch.empty_like(x, memory_format=torch.contiguous_format)
    if rows:
        _launch_gemv(x, weight, bias, out, (residual, norm_weight, total, eps), tile)
    return out, total


def _launch_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    add_norm: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float] | None,
    tile: GemvTile,
    *,
    silu_mul: bool = False,
) -> None:
    n, k = weight.shape
    residual, norm_weight, total, eps = add_norm if add_norm is not None else (x, weight, out, 0.0)
    pdl = pdl_launch(x.device)
    _LAUNCH_GEMV(
        (cdiv(n, tile.block_n),),
        (
            x, weight, weight if bias is None else bias, out, residual, norm_weight, total, x.shape[0], n,
            x.stride(0), out.stride(0), residual.stride(0), eps,
        ),
        {
            "K": k, "HAS_BIAS": bias is not None, "SILU_MUL": silu_mul, "ADD_NORM": add_norm is not None,
            "BLOCK_T": next_power_of_2(x.shape[0]), "BLOCK_N": tile.block_n,
            "BLOCK_K": min(tile.block_k, next_power_of_2(k)), "PDL": pdl,
        },
        tile.num_warps,
        launch_pdl=pdl,
    )  # fmt: skip


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up`` ``[T, 2I]`` (gate then up), rounded once, into a new ``[T, I]``."""
    rows, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((rows, width), dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        grid = (rows, cdiv(width, ELEMENTWISE_BLOCK))
        pdl = pdl_launch(gate_up.device)
        _LAUNCH_SILU_AND_MUL(
            grid,
            (gate_up, out, width, gate_up.stride(0), out.stride(0)),
            {"BLOCK": ELEMENTWISE_BLOCK, "PDL": pdl},
            launch_pdl=pdl,
        )
    return out
