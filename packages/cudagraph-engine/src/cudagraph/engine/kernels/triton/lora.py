"""The batched LoRA delta of a projection in two Triton kernels, on plain tensors (the adapters' side lays them out).

Per token ``t`` and target ``j``: ``out[t, rows_j] += (x[t] @ A_j^T * scales[t]) @ B_j^T``, where ``A_j`` stacks
every slot's A of target ``j`` (``slots * rank`` rows) and ``scales[t]`` is the token's row of the slots' scale
table (its slot's scaling over its ranks, zeros elsewhere), so one fixed-shape launch serves any mix of slots.

- ``shrink``: ``s = (x @ A^T) * scales`` for every target at once, the scale in the epilogue. Programs split the
  columns of ``s`` (a few each), the tokens (so a prefill of thousands is tiled too) and, for the few tokens of a
  decode step, the reduction: each split stores its float32 partial product, which ``expand`` sums on load, so a
  decode step reads A over many programs without atomics or a zeroing launch.
- ``expand``: ``out[:, rows] += s @ B^T`` in place. ``b`` keeps each target's B in its own rows and its own column
  block (zeros elsewhere); a program owning a block of output rows reads only the column block of the target(s)
  whose rows it overlaps, masked to their row bounds (which need not be block aligned), never the zeros.

Numerics: products accumulate in float32; ``s`` is rounded to the model dtype before the expand (as the two
matmuls of the torch path round it) and each output value once after its add. Grids are functions of shapes only,
nothing syncs with the host: capturable in a CUDA graph. Under ``TRITON_INTERPRET=1`` the same kernels run on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from cudagraph.backend_utils import FastLauncher, cdiv, next_power_of_2

from .pdl import pdl_launch

MAX_TARGETS = 3
"""Targets one projection adds to (q, k and v)."""


@triton.jit
def _lora_shrink_kernel(
    x_ptr,
    a_ptr,
    scales_ptr,
    partial_ptr,
    num_tokens,
    n,
    k,
    x_stride,
    scales_stride,
    k_per_split,
    WIDTH: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    columns = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    tokens = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    split = tl.program_id(2)
    column_mask = columns < n
    token_mask = tokens < num_tokens
    accumulator = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    first = split * k_per_split
    for start in range(first, first + k_per_split, BLOCK_K):
        depth = start + tl.arange(0, BLOCK_K)
        depth_mask = depth < k
        x = tl.load(
            x_ptr + tokens[:, None] * x_stride + depth[None, :],
            mask=token_mask[:, None] & depth_mask[None, :],
            other=0.0,
        )
        a = tl.load(
            a_ptr + columns[:, None] * k + depth[None, :], mask=column_mask[:, None] & depth_mask[None, :], other=0.0
        )
        accumulator += tl.dot(x, tl.trans(a), input_precision=PRECISION)
    mask = token_mask[:, None] & column_mask[None, :]
    scale = tl.load(scales_ptr + tokens[:, None] * scales_stride + (columns % WIDTH)[None, :], mask=mask, other=0.0)
    partial = partial_ptr + (split * num_tokens + tokens[:, None]) * n + columns[None, :]
    tl.store(partial, accumulator * scale.to(tl.float32), mask=mask)


@triton.jit
def _lora_expand_kernel(
    partial_ptr,
    b_ptr,
    out_ptr,
    num_tokens,
    n,
    out_stride,
    row_start,
    row_stop,
    start0,
    stop0,
    start1,
    stop1,
    start2,
    stop2,
    NUM_TARGETS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    WIDTH: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    block_first = row_start + tl.program_id(0) * BLOCK_N
    block_stop = tl.minimum(block_first + BLOCK_N, row_stop)
    features = block_first + tl.arange(0, BLOCK_N)
    tokens = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    token_mask = tokens < num_tokens
    accumulator = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    for target in tl.static_range(NUM_TARGETS):
        if target == 0:
            low, high = start0, stop0
        elif target == 1:
            low, high = start1, stop1
        else:
            low, high = start2, stop2
        if (low < block_stop) & (high > block_first):  # this block overlaps the target's rows: read its column block
            feature_mask = (features >= low) & (features < high)
            for rank_start in tl.static_range(0, WIDTH, BLOCK_R):
                ranks = rank_start + tl.arange(0, BLOCK_R)
                rank_mask = ranks < WIDTH
                s_mask = token_mask[:, None] & rank_mask[None, :]
                s_rows = partial_ptr + tokens[:, None] * n + target * WIDTH + ranks[None, :]
                shrunk = tl.zeros((BLOCK_T, BLOCK_R), dtype=tl.float32)
                for split in tl.static_range(SPLIT_K):
                    shrunk += tl.load(s_rows + split * num_tokens * n, mask=s_mask, other=0.0)
                b_row = b_ptr + (features - row_start)[:, None] * (NUM_TARGETS * WIDTH) + target * WIDTH
                b = tl.load(b_row + ranks[None, :], mask=feature_mask[:, None] & rank_mask[None, :], other=0.0)
                accumulator += tl.dot(shrunk.to(b.dtype), tl.trans(b), input_precision=PRECISION)
    mask = token_mask[:, None] & (features < row_stop)[None, :]
    out_rows = out_ptr + tokens[:, None] * out_stride + features[None, :]
    current = tl.load(out_rows, mask=mask, other=0.0)
    tl.store(out_rows, (current.to(tl.float32) + accumulator).to(current.dtype), mask=mask)


_LAUNCH_SHRINK = FastLauncher(_lora_shrink_kernel)
_LAUNCH_EXPAND = FastLauncher(_lora_expand_kernel)
"""Each kernel's launcher (``cudagraph.backend_utils.FastLauncher``: Triton's JIT work once per specialization)."""


@dataclass(frozen=True)
class LoraTile:
    """How the delta tiles a step of up to ``max_tokens`` tokens: ``block_t`` tokens a program (``tl.dot`` needs at
    least 16), ``shrink_block_n`` columns of ``s`` and ``block_k`` of the reduction per shrink step, the reduction
    split over ``split_k`` programs, and ``expand_block_n`` output rows an expand program owns."""

    max_tokens: int
    block_t: int
    shrink_block_n: int
    block_k: int
    split_k: int
    expand_block_n: int


LORA_TILES = (
    LoraTile(max_tokens=16, block_t=16, shrink_block_n=16, block_k=256, split_k=4, expand_block_n=32),
    LoraTile(max_tokens=64, block_t=32, shrink_block_n=16, block_k=128, split_k=4, expand_block_n=64),
    LoraTile(max_tokens=2**62, block_t=64, shrink_block_n=32, block_k=64, split_k=1, expand_block_n=64),
)
"""By step tokens, smallest first: the first tile whose ``max_tokens`` covers a step is used. A decode step splits
the reduction over many programs (the Llama-3-8B q/k/v shrink at 8 tokens: 24 column blocks x 4 splits = 96
programs, each reading 64 KiB of A); a prefill of thousands of tokens tiles the tokens instead. The decode tile is
the fastest of ``bench/bench_lora.py --kernels --sweep``'s 120 on an H200 (Llama-3-8B, 8 tokens, 8 adapters of rank
16: q/k/v 9.65 us a layer against 11.44 for the tile before it, o 9.09 against 9.72)."""


def lora_tile(tokens: int) -> LoraTile:
    """The tile for a step of ``tokens`` tokens."""
    return next(tile for tile in LORA_TILES if tokens <= tile.max_tokens)


def _precision(dtype: torch.dtype) -> str | None:
    """float32 operands multiply in full precision (``tl.dot`` would round them to tf32); 16-bit ones as they are."""
    return "ieee" if dtype == torch.float32 else None


def lora_delta(
    out: torch.Tensor,
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scales: torch.Tensor,
    rows: Sequence[tuple[int, int]],
    tile: LoraTile | None = None,
) -> None:
    """Add every target's LoRA delta of ``x`` ``[T, K]`` to its rows of ``out`` ``[T, N]``, in place, in two launches.

    ``a`` ``[targets, slots, rank, K]`` and ``b`` ``[row_stop - row_start, targets, slots, rank]`` (contiguous) are
    the factors of every target and slot (``b``: target ``j``'s B in its own rows of column block ``j``, zeros
    elsewhere); ``scales`` ``[T, slots * rank]`` holds each token's row of the scale table; ``rows`` gives, per
    target, the ``(start, stop)`` output rows of ``out`` it adds to (``row_start`` is the least start). At most
    ``MAX_TARGETS`` targets. ``tile`` is ``LORA_TILES``' by default (``bench/bench_lora.py --kernels --sweep``
    passes others)."""
    num_tokens, k = x.shape
    num_targets, slots, rank, a_k = a.shape
    width = slots * rank
    if not 0 < len(rows) == num_targets <= MAX_TARGETS:
        raise ValueError(
            f"lora_delta takes 1 to {MAX_TARGETS} targets, one row range each: got {num_targets} targets in a and "
            f"{len(rows)} row ranges"
        )
    row_start, row_stop = min(start for start, _ in rows), max(stop for _, stop in rows)
    if a_k != k or b.shape != (row_stop - row_start, num_targets, slots, rank) or scales.shape[1] != width:
        raise ValueError(
            f"lora_delta of x {tuple(x.shape)} needs a [targets, slots, rank, {k}], b [{row_stop - row_start}, "
            f"targets, slots, rank] and scales [T, slots * rank]: got a {tuple(a.shape)}, b {tuple(b.shape)}, "
            f"scales {tuple(scales.shape)}"
        )
    if not (a.is_contiguous() and b.is_contiguous()) or x.stride(1) != 1 or out.stride(1) != 1 or scales.stride(1) != 1:
        raise ValueError("lora_delta needs a and b contiguous and the rows of x, out and scales contiguous")
    if num_tokens == 0:
        return
    tile = tile or lora_tile(num_tokens)
    n = num_targets * width
    precision = _precision(x.dtype)
    partial = torch.empty((tile.split_k, num_tokens, n), dtype=torch.float32, device=x.device)
    k_per_split = cdiv(cdiv(k, tile.split_k), tile.block_k) * tile.block_k
    token_blocks = cdiv(num_tokens, tile.block_t)
    pdl = pdl_launch(x.device)
    _LAUNCH_SHRINK(
        (cdiv(n, tile.shrink_block_n), token_blocks, tile.split_k),
        (x, a, scales, partial, num_tokens, n, k, x.stride(0), scales.stride(0), k_per_split),
        {
            "WIDTH": width, "BLOCK_T": tile.block_t, "BLOCK_N": tile.shrink_block_n,
            "BLOCK_K": min(tile.block_k, max(16, next_power_of_2(k))), "PRECISION": precision, "PDL": pdl,
        },
        launch_pdl=pdl,
    )  # fmt: skip
    bounds = [bound for pair in rows for bound in pair] + [0, 0] * (MAX_TARGETS - num_targets)
    _LAUNCH_EXPAND(
        (cdiv(row_stop - row_start, tile.expand_block_n), token_blocks),
        (partial, b, out, num_tokens, n, out.stride(0), row_start, row_stop, *bounds),
        {
            "NUM_TARGETS": num_targets, "SPLIT_K": tile.split_k, "WIDTH": width, "BLOCK_T": tile.block_t,
            "BLOCK_N": tile.expand_block_n, "BLOCK_R": max(16, min(64, next_power_of_2(width))),
            "PRECISION": precision, "PDL": pdl,
        },
        launch_pdl=pdl,
    )  # fmt: skip
