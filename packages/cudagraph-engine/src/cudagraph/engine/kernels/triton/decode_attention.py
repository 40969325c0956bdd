"""Paged decode attention as one Triton kernel: every row's query heads over its cached keys and values, read
through the request-to-token table, with no metadata built per step.

A program owns one (row, kv head, split): the query heads sharing that kv head (grouped-query attention, the group
padded to a tensor-core tile) against one split of the row's context (``split_tokens`` tokens from a fixed
position), with an online softmax. A row that fits in one split is written straight out. A longer row's splits each
write a normalized partial output and its log-sum-exp and count themselves in; the split that arrives last merges
them in split order and resets the count. So a layer is one launch whatever the lengths (FlashInfer's split-kv
decode launches a merge kernel after its own), and a row's result depends on its length only, never on the batch
around it or on which split finished last. The grid and the scratch depend only on shapes and the lengths are read
on the device, so a launch is capturable in a CUDA graph and replays for any lengths. Under ``TRITON_INTERPRET=1``
the same kernel runs on CPU tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from cudagraph.backend_utils import FastLauncher, next_power_of_2

from .pdl import pdl_launch


@triton.jit
def online_softmax_step(
    q, keys, values, visible, running_max, running_sum, acc, scale_log2, DOT_PRECISION: tl.constexpr
):  # fmt: skip
    """One key block of an online softmax in base 2: the rows' scores against ``keys`` (where ``visible``), the
    running max, sum and weighted values rescaled to the new max. Returns ``(running_max, running_sum, acc)``."""
    scores = tl.dot(q, tl.trans(keys), input_precision=DOT_PRECISION) * scale_log2
    scores = tl.where(visible, scores, float("-inf"))
    new_max = tl.maximum(running_max, tl.max(scores, axis=1))
    rescale = tl.exp2(running_max - new_max)
    weights = tl.exp2(scores - new_max[:, None])
    running_sum = running_sum * rescale + tl.sum(weights, axis=1)
    acc = acc * rescale[:, None] + tl.dot(weights.to(values.dtype), values, input_precision=DOT_PRECISION)
    return new_max, running_sum, acc


@triton.jit
def _paged_decode_kernel(
    q_ptr, q_row_stride, kv_ptr, kv_slot_stride, kv_value_offset, out_ptr, out_row_stride, req_to_token_ptr,
    req_to_token_stride, req_pool_indices_ptr, seq_lens_ptr, partial_out_ptr, partial_lse_ptr, arrivals_ptr,
    scale_log2, GROUP: tl.constexpr, GROUP_BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT_TOKENS: tl.constexpr, SPLITS: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # The row's length and table row are loaded side by side (neither waits for the other).
    seq_len = tl.load(seq_lens_ptr + row).to(tl.int32)
    table_row = req_to_token_ptr + tl.load(req_pool_indices_ptr + row).to(tl.int64) * req_to_token_stride
    used = tl.cdiv(seq_len, SPLIT_TOKENS)
    if split < used:
        heads = tl.arange(0, GROUP_BLOCK)
        dims = tl.arange(0, HEAD_DIM)
        head_mask = heads < GROUP
        q_heads = kv_head * GROUP + heads
        q_at = q_ptr + row * q_row_stride + q_heads[:, None] * HEAD_DIM + dims[None, :]
        q = tl.load(q_at, mask=head_mask[:, None], other=0.0)
        running_max = tl.full((GROUP_BLOCK,), float("-inf"), dtype=tl.float32)
        running_sum = tl.zeros((GROUP_BLOCK,), dtype=tl.float32)
        acc = tl.zeros((GROUP_BLOCK, HEAD_DIM), dtype=tl.float32)
        end = tl.minimum((split + 1) * SPLIT_TOKENS, seq_len)
        block_start = split * SPLIT_TOKENS
        tokens = block_start + tl.arange(0, BLOCK_N)
        slots = tl.load(table_row + tokens, mask=tokens < end, other=0).to(tl.int64)
        # A while loop, not range(start, end, BLOCK_N): Triton's interpreter cannot take loaded bounds into a range
        # with NumPy 2.4 (triton-lang/triton#9171). Each step loads its keys and values, then the next block's slots
        # before computing, so a step waits on one load, not on a slot load and then a key load.
        while block_start < end:
            valid = tokens < end
            keys_at = kv_ptr + slots[:, None] * kv_slot_stride + kv_head * HEAD_DIM + dims[None, :]
            keys = tl.load(keys_at, mask=valid[:, None], other=0.0)
            values = tl.load(keys_at + kv_value_offset, mask=valid[:, None], other=0.0)
            tokens += BLOCK_N
            slots = tl.load(table_row + tokens, mask=tokens < end, other=0).to(tl.int64)
            running_max, running_sum, acc = online_softmax_step(
                q, keys, values, valid[None, :], running_max, running_sum, acc, scale_log2, DOT_PRECISION
            )
            block_start += BLOCK_N

        out_at = out_ptr + row * out_row_stride + q_heads[:, None] * HEAD_DIM + dims[None, :]
        if used == 1:
            tl.store(out_at, (acc / running_sum[:, None]).to(out_ptr.dtype.element_ty), mask=head_mask[:, None])
        else:
            # (row, kv head)'s partials: [SPLITS, GROUP, HEAD_DIM] outputs and [SPLITS, GROUP] log-sum-exps (base 2).
            pair = row * tl.num_programs(1) + kv_head
            lse_at = partial_lse_ptr + pair * SPLITS * GROUP + heads
            partial_at = partial_out_ptr + (pair * SPLITS * GROUP + heads[:, None]) * HEAD_DIM + dims[None, :]
            tl.store(partial_at + split * GROUP * HEAD_DIM, acc / running_sum[:, None], mask=head_mask[:, None])
            tl.store(lse_at + split * GROUP, running_max + tl.log2(running_sum), mask=head_mask)
            # Every thread's partial is written before this program counts itself in (release); the program that
            # counts last sees every split's (acquire), merges them in split order and resets the count.
            tl.debug_barrier()
            arrived = tl.atomic_add(arrivals_ptr + pair, 1, sem="acq_rel")
            if arrived == used - 1:
                top = tl.full((GROUP_BLOCK,), float("-inf"), dtype=tl.float32)
                index = 0
                while index < used:
                    top = tl.maximum(
                        top, tl.load(lse_at + index * GROUP, mask=head_mask, other=0.0, cache_modifier=".cg")
                    )
                    index += 1
                merged = tl.zeros((GROUP_BLOCK, HEAD_DIM), dtype=tl.float32)
                total = tl.zeros((GROUP_BLOCK,), dtype=tl.float32)
                index = 0
                while index < used:
                    weight = tl.exp2(
                        tl.load(lse_at + index * GROUP, mask=head_mask, other=0.0, cache_modifier=".cg") - top
                    )
                    part = tl.load(
                        partial_at + index * GROUP * HEAD_DIM, mask=head_mask[:, None], other=0.0, cache_modifier=".cg"
                    )
                    merged += weight[:, None] * part
                    total += weight
                    index += 1
                tl.store(out_at, (merged / total[:, None]).to(out_ptr.dtype.element_ty), mask=head_mask[:, None])
                tl.atomic_xchg(arrivals_ptr + pair, 0)


_DECODE_LAUNCHER = FastLauncher(_paged_decode_kernel)


@dataclass(frozen=True)
class DecodeTile:
    """How ``_paged_decode_kernel`` tiles a step: ``block_n`` context tokens a loop step, contexts split every
    ``min_split_tokens`` tokens (more where the cache's context would need over ``max_splits`` splits), and the
    warps of a program."""

    block_n: int
    min_split_tokens: int
    max_splits: int
    num_warps: int


DECODE_TILE = DecodeTile(block_n=128, min_split_tokens=256, max_splits=64, num_warps=4)
"""The tile the backend uses: the best all-round tile of ``bench/bench_attention.py --sweep`` on an H100 (Qwen3-0.6B's
16/8 heads of 128, bfloat16), within 9 % of each case's fastest tile at 1 x 128, 8 x 128, 32 x 512 and 1 x 4000
(rows x cached tokens)."""


class DecodeRows(NamedTuple):
    """A decode batch's rows as the kernel reads them, on the device: each row's request (its row of the
    request-to-token table) and its length in cached tokens."""

    req_pool_indices: Tensor
    seq_lens: Tensor


@dataclass(frozen=True)
class DecodeScratch:
    """Room for the split partials of ``rows`` batch rows and their arrival counts (zero between launches)."""

    rows: int
    partial_out: Tensor
    """float32, ``[rows * kv_heads * splits * group * head_dim]``."""
    partial_lse: Tensor
    """float32, ``[rows * kv_heads * splits * group]``."""
    arrivals: Tensor
    """int32, ``[rows * kv_heads]``."""


class PagedDecodeKernel:
    """Launches ``_paged_decode_kernel`` for one model shape and cache.

    A row's context is split at fixed token positions (every ``split_tokens``, a constant of the cache), so how a row
    is computed depends only on its length, never on the batch around it: a graph's padded batch computes each real
    row bit for bit as an eager batch does. A row no longer than ``split_tokens`` (every row of a short-context cache)
    is one program per kv head, with no merge. Launches run one after another on one stream and share the scratch.
    """

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        max_context: int,
        device: torch.device,
        tile: DecodeTile = DECODE_TILE,
    ) -> None:
        if head_dim < 16 or head_dim & (head_dim - 1):
            raise ValueError(f"triton decode attention needs a power-of-two head_dim of at least 16, got {head_dim}")
        self.num_kv_heads = num_kv_heads
        self.group = num_heads // num_kv_heads
        self.head_dim = head_dim
        self.scale_log2 = scale * 1.4426950408889634  # softmax in base 2: exp(x * s) == exp2(x * s * log2(e))
        self.tile = tile
        per_split = triton.cdiv(triton.cdiv(max_context, tile.max_splits), tile.block_n) * tile.block_n
        self.split_tokens = max(tile.min_split_tokens, per_split)
        """Tokens of a row's context each split covers (a multiple of ``tile.block_n``)."""
        self.splits = triton.cdiv(max_context, self.split_tokens)
        """Splits of the longest context: the grid's third dimension."""
        self.device = device
        self.scratch = self._allocate(0)
        self._outgrown: list[DecodeScratch] = []
        """Scratch a larger one replaced, kept alive: graphs captured with it still write there."""

    def _allocate(self, rows: int) -> DecodeScratch:
        pairs = rows * self.num_kv_heads if self.splits > 1 else 0
        partials = pairs * self.splits * self.group
        return DecodeScratch(
            rows=rows,
            partial_out=torch.empty(partials * self.head_dim, dtype=torch.float32, device=self.device),
            partial_lse=torch.empty(partials, dtype=torch.float32, device=self.device),
            arrivals=torch.zeros(max(pairs, 1), dtype=torch.int32, device=self.device),
        )

    def reserve(self, rows: int) -> None:
        """Make room for batches of up to ``rows`` rows (before capturing graphs of that many: a launch being
        captured cannot allocate)."""
        if rows > self.scratch.rows:
            self._outgrown.append(self.scratch)
            self.scratch = self._allocate(rows)

    def __call__(self, q: Tensor, kv_buffer: Tensor, output: Tensor, req_to_token: Tensor, rows: DecodeRows) -> None:
        """Attention of ``q`` ``[B, Hq*D]`` over the cached tokens of each row (``rows.seq_lens[b]`` tokens at the
        slots of ``req_to_token[rows.req_pool_indices[b]]`` in the layer's ``kv_buffer`` ``[slots, 2, Hkv, D]``) into
        ``output`` ``[B, Hq*D]``. The tensors may differ from call to call (``FastLauncher`` keys the compiled kernel
        on what Triton specializes on)."""
        if q.shape[0]:
            grid, args, constexprs = self._launch_arguments(q, kv_buffer, output, req_to_token, rows)
            _DECODE_LAUNCHER(grid, args, constexprs, self.tile.num_warps, launch_pdl=constexprs["PDL"])

    def bind(
        self, q: Tensor, kv_buffer: Tensor, output: Tensor, req_to_token: Tensor, rows: DecodeRows
    ) -> Callable[[], None]:
        """The call ``self(q, kv_buffer, ...)`` as a zero-argument launch with every argument taken now, straight to
        the compiled kernel's launcher on CUDA (``cudagraph.backend_utils.direct_launch``): for tensors that keep
        their shapes and addresses, a graph's static buffers."""
        if not q.shape[0]:
            return _nothing
        grid, args, constexprs = self._launch_arguments(q, kv_buffer, output, req_to_token, rows)
        return _DECODE_LAUNCHER.bind(grid, args, constexprs, self.tile.num_warps, launch_pdl=constexprs["PDL"])

    def _launch_arguments(
        self, q: Tensor, kv_buffer: Tensor, output: Tensor, req_to_token: Tensor, rows: DecodeRows
    ) -> tuple[tuple[int, int, int], tuple[Any, ...], dict[str, Any]]:
        """The grid, the runtime arguments and the constexprs of a launch over ``q``'s rows, the scratch grown for
        them first (refused while a graph is being captured: a captured launch cannot allocate)."""
        batch_size = q.shape[0]
        if batch_size > self.scratch.rows:
            if q.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"triton decode attention has scratch for {self.scratch.rows} rows and a graph of {batch_size} is "
                    "being captured; reserve(rows) before capturing (the backend's init_cuda_graph_state does)"
                )
            self.reserve(batch_size)
        scratch = self.scratch
        args = (
            q, q.stride(0), kv_buffer, kv_buffer.stride(0), kv_buffer.stride(1), output, output.stride(0),
            req_to_token, req_to_token.stride(0), rows.req_pool_indices, rows.seq_lens,
            scratch.partial_out, scratch.partial_lse, scratch.arrivals, self.scale_log2,
        )  # fmt: skip
        constexprs = {
            "GROUP": self.group,
            "GROUP_BLOCK": max(16, next_power_of_2(self.group)),
            "HEAD_DIM": self.head_dim,
            "BLOCK_N": self.tile.block_n,
            "SPLIT_TOKENS": self.split_tokens,
            "SPLITS": self.splits,
            "DOT_PRECISION": "ieee" if q.dtype == torch.float32 else "tf32",
            "PDL": pdl_launch(q.device),
        }
        return (batch_size, self.num_kv_heads, self.splits), args, constexprs


def _nothing() -> None:
    """The launch of an empty step."""
