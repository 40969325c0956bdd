"""Paged extend (prefill) attention as one Triton kernel: each new token's query heads over its request's cached
tokens up to itself, read through the request-to-token table (the new tokens' keys and values are stored first).

A program owns one kv head of a block of up to ``block_m`` consecutive new tokens of one request, with the query heads
that share that kv head: ``block_m x group`` rows that read each key and value block once (one row per token would
read a request's whole context once per token). Each row stops at its own causal length (its position + 1).

The blocks are laid out on the device from the batch's fixed-size tensors (``extend_rows``): blocks per request in
request order, then the padded tokens', at most ``cdiv(tokens, block_m) + requests + 1`` of them, the unused ones
empty. So the grid depends on
shapes only, nothing is computed on the host, and a launch is captured inside a graph (prefill ``full``). Under
``TRITON_INTERPRET=1`` the same kernel runs on CPU tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from cudagraph.backend_utils import FastLauncher, cdiv, next_power_of_2
from cudagraph.runner import PADDING_REQ_POOL_INDEX, ForwardBatch

from .decode_attention import online_softmax_step
from .pdl import pdl_launch


@triton.jit
def _paged_extend_kernel(
    q_ptr, q_row_stride, kv_ptr, kv_slot_stride, kv_value_offset, out_ptr, out_row_stride, req_to_token_ptr,
    req_to_token_stride, token_rows_ptr, token_lens_ptr, block_starts_ptr, block_counts_ptr, scale_log2,
    GROUP: tl.constexpr, GROUP_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    block = tl.program_id(0)
    kv_head = tl.program_id(1)
    count = tl.load(block_counts_ptr + block)
    if count > 0:
        start = tl.load(block_starts_ptr + block)
        rows = tl.arange(0, BLOCK_M * GROUP_BLOCK)
        offset = rows // GROUP_BLOCK
        head = rows % GROUP_BLOCK
        row_mask = (offset < count) & (head < GROUP)
        tokens = start + offset
        # A masked row attends to the first key only (never to nothing, which would make its softmax 0 / 0).
        lengths = tl.load(token_lens_ptr + tokens, mask=row_mask, other=1)
        end = tl.max(lengths, axis=0)
        table_row = req_to_token_ptr + tl.load(token_rows_ptr + start).to(tl.int64) * req_to_token_stride
        dims = tl.arange(0, HEAD_DIM)
        q_heads = kv_head * GROUP + head
        q_at = q_ptr + tokens[:, None] * q_row_stride + q_heads[:, None] * HEAD_DIM + dims[None, :]
        q = tl.load(q_at, mask=row_mask[:, None], other=0.0)
        running_max = tl.full((BLOCK_M * GROUP_BLOCK,), float("-inf"), dtype=tl.float32)
        running_sum = tl.zeros((BLOCK_M * GROUP_BLOCK,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_M * GROUP_BLOCK, HEAD_DIM), dtype=tl.float32)
        block_start = 0
        keys_pos = tl.arange(0, BLOCK_N)
        slots = tl.load(table_row + keys_pos, mask=keys_pos < end, other=0).to(tl.int64)
        # A while loop for the interpreter's sake (see decode_attention); the next block's slots load before computing.
        while block_start < end:
            valid = keys_pos < end
            keys_at = kv_ptr + slots[:, None] * kv_slot_stride + kv_head * HEAD_DIM + dims[None, :]
            keys = tl.load(keys_at, mask=valid[:, None], other=0.0)
            values = tl.load(keys_at + kv_value_offset, mask=valid[:, None], other=0.0)
            next_pos = keys_pos + BLOCK_N
            slots = tl.load(table_row + next_pos, mask=next_pos < end, other=0).to(tl.int64)
            running_max, running_sum, acc = online_softmax_step(
                q, keys, values, keys_pos[None, :] < lengths[:, None], running_max, running_sum, acc, scale_log2,
                DOT_PRECISION,
            )  # fmt: skip
            keys_pos = next_pos
            block_start += BLOCK_N
        out_at = out_ptr + tokens[:, None] * out_row_stride + q_heads[:, None] * HEAD_DIM + dims[None, :]
        tl.store(out_at, (acc / running_sum[:, None]).to(out_ptr.dtype.element_ty), mask=row_mask[:, None])


_EXTEND_LAUNCHER = FastLauncher(_paged_extend_kernel)

EXTEND_ROWS_A_PROGRAM = 64
"""Rows a program computes (``block_m`` new tokens x the query heads of a kv head, the group padded to a power of
two): the tile of the two dots each key block takes part in."""


@dataclass(frozen=True)
class ExtendRows:
    """An extend batch laid out for the kernel, on the device: per new token, its request's row in the
    request-to-token table and its causal length; per block of tokens, its first token and token count (0: unused)."""

    req_pool_indices: Tensor
    seq_lens: Tensor
    block_starts: Tensor
    block_counts: Tensor


def uniform_extend_batch(batch: ForwardBatch) -> ForwardBatch:
    """``batch`` (a uniform step: the same number of tokens for every request, a verify step's ``query_len``) with
    the extend fields that say so, made on the device from its shapes alone (capturable): request ``i``'s tokens
    start at ``i * query_len``."""
    requests = batch.req_pool_indices.shape[0]
    query_len = batch.positions.shape[0] // max(requests, 1)
    device = batch.positions.device
    starts = torch.arange(requests, dtype=torch.int32, device=device) * query_len
    counts = torch.full((requests,), query_len, dtype=torch.int32, device=device)
    return replace(batch, extend_start_loc=starts, extend_seq_lens=counts)


def extend_rows(batch: ForwardBatch, block_m: int) -> ExtendRows:
    """``ExtendRows`` of ``batch`` in blocks of up to ``block_m`` tokens, from its fixed-size tensors only (no host
    sync, capturable). Token ``t`` belongs to the request whose ``[extend_start_loc, extend_start_loc +
    extend_seq_lens)`` holds it and attends to its first ``positions[t] + 1`` tokens; a padded token (no request holds
    it; they follow the real ones) attends to one token of the scratch row, in blocks of its own."""
    if batch.extend_start_loc is None or batch.extend_seq_lens is None:
        raise ValueError("an extend batch needs extend_start_loc and extend_seq_lens on the device")
    device = batch.positions.device
    num_tokens, num_requests = batch.positions.shape[0], batch.extend_seq_lens.shape[0]
    starts, counts = batch.extend_start_loc.long(), batch.extend_seq_lens.long()
    tokens = torch.arange(num_tokens, device=device)[:, None]
    owned = (tokens >= starts[None, :]) & (tokens < (starts + counts)[None, :])
    real = owned.any(dim=1)
    request = owned.to(torch.int32).argmax(dim=1)
    rows = torch.where(real, batch.req_pool_indices[request], PADDING_REQ_POOL_INDEX)
    lengths = torch.where(real, batch.positions + 1, 1).to(torch.int32)
    # Blocks: each request's tokens in blocks of block_m, requests in order, then the padded tokens (after the real
    # ones) as one more request of the scratch row, so that every output row is written; empty blocks last.
    real_tokens = counts.sum(dim=0, keepdim=True)
    starts = torch.cat([starts, real_tokens])
    counts = torch.cat([counts, num_tokens - real_tokens])
    blocks = (counts + block_m - 1) // block_m
    block_ends = torch.cumsum(blocks, dim=0)
    block_index = torch.arange(cdiv(num_tokens, block_m) + num_requests + 1, device=device)[:, None]
    owner = (block_ends[None, :] <= block_index).sum(dim=1)
    used = owner <= num_requests
    owner = owner.clamp(max=num_requests)
    within = block_index[:, 0] - (block_ends - blocks)[owner]
    block_counts = torch.where(used, (counts[owner] - within * block_m).clamp(max=block_m), 0)
    block_starts = torch.where(used, starts[owner] + within * block_m, 0)
    return ExtendRows(rows, lengths, block_starts.to(torch.int32), block_counts.to(torch.int32))


class PagedExtendKernel:
    """Extend attention for one model's head layout (see the module); ``block_m`` new tokens a program."""

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, *, block_n: int = 64, num_warps: int = 8
    ) -> None:
        if head_dim < 16 or head_dim & (head_dim - 1):
            raise ValueError(f"triton extend attention needs a power-of-two head_dim of at least 16, got {head_dim}")
        self.num_kv_heads = num_kv_heads
        self.group = num_heads // num_kv_heads
        self.group_block = next_power_of_2(self.group)
        self.block_m = max(1, EXTEND_ROWS_A_PROGRAM // self.group_block)
        """New tokens a program computes."""
        self.head_dim = head_dim
        self.scale_log2 = scale * 1.4426950408889634  # softmax in base 2
        self.block_n = block_n
        self.num_warps = num_warps

    def rows_of(self, batch: ForwardBatch) -> ExtendRows:
        """``extend_rows`` of ``batch`` in this kernel's blocks."""
        return extend_rows(batch, self.block_m)

    def __call__(self, q: Tensor, kv_buffer: Tensor, output: Tensor, req_to_token: Tensor, rows: ExtendRows) -> None:
        """Attention of every new token's heads in ``q`` ``[T, Hq*D]`` into ``output`` ``[T, Hq*D]`` over the layer's
        ``kv_buffer`` ``[slots, 2, Hkv, D]``, laid out by ``rows`` (``rows_of`` the batch)."""
        blocks = rows.block_counts.shape[0]
        if not q.shape[0] or not blocks:
            return
        grid, args, constexprs = self._launch_arguments(q, kv_buffer, output, req_to_token, rows)
        _EXTEND_LAUNCHER(grid, args, constexprs, self.num_warps, launch_pdl=constexprs["PDL"])

    def bind(
        self, q: Tensor, kv_buffer: Tensor, output: Tensor, req_to_token: Tensor, rows: ExtendRows
    ) -> Callable[[], None]:
        """The call ``self(q, kv_buffer, output, req_to_token, rows)`` as a zero-argument launch with every argument
        taken now, straight to the compiled kernel's launcher on CUDA: for tensors that keep their shapes and
        addresses (a graph's static buffers, and ``rows`` made inside the graph that replays before the launch)."""
        if not q.shape[0] or not rows.block_counts.shape[0]:
            return _nothing
        grid, args, constexprs = self._launch_arguments(q, kv_buffer, output, req_to_token, rows)
        return _EXTEND_LAUNCHER.bind(grid, args, constexprs, self.num_warps, launch_pdl=constexprs["PDL"])

    def _launch_arguments(
        self, q: Tensor, kv_buffer: Tensor, output: Tensor, req_to_token: Tensor, rows: ExtendRows
    ) -> tuple[tuple[int, int], tuple[Any, ...], dict[str, Any]]:
        """The grid, the runtime arguments and the constexprs of a launch over ``rows``' blocks."""
        grid = (rows.block_counts.shape[0], self.num_kv_heads)
        args = (
            q, q.stride(0), kv_buffer, kv_buffer.stride(0), kv_buffer.stride(1), output, output.stride(0),
            req_to_token, req_to_token.stride(0), rows.req_pool_indices, rows.seq_lens, rows.block_starts,
            rows.block_counts, self.scale_log2,
        )  # fmt: skip
        constexprs = {
            "GROUP": self.group, "GROUP_BLOCK": self.group_block, "BLOCK_M": self.block_m,
            "HEAD_DIM": self.head_dim, "BLOCK_N": self.block_n,
            "DOT_PRECISION": "ieee" if q.dtype == torch.float32 else "tf32", "PDL": pdl_launch(q.device),
        }  # fmt: skip
        return grid, args, constexprs


def _nothing() -> None:
    """A bound launch with no work (no tokens)."""
