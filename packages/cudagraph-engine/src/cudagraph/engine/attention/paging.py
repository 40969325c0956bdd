"""Page tables for paged attention kernels, built from the request-to-token table: what FlashInfer's ``plan`` reads.

A kernel over pages needs, per request row, where its pages start in one flat list of page ids (``indptr``, on the
host), the page ids themselves (``indices``, on the device) and how full its last page is. The host side comes from
host lengths; the device side is gathered from the request-to-token table by ops of fixed shape, so building it never
waits on the device and a static buffer keeps its address. Torch and numpy: it imports and is tested without
FlashInfer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from cudagraph.runner import ForwardBatch


@dataclass(frozen=True)
class HostPages:
    """Per request row, from its context length: page index pointers and the number of tokens in its last page."""

    indptr: torch.Tensor
    """[rows + 1] int32 (CPU): row ``r``'s pages are ``indices[indptr[r]:indptr[r + 1]]``."""
    last_page_len: torch.Tensor
    """[rows] int32 (CPU): tokens in each row's last page (``page_size`` when the page is full)."""
    total: int
    """Pages of all rows together (``indptr[-1]``)."""

    @classmethod
    def of(cls, context_tokens: torch.Tensor | Sequence[int], page_size: int) -> HostPages:
        """The pages of rows holding ``context_tokens`` (a CPU integer tensor or ints, each at least 1) tokens.

        Computed with numpy: this runs before every graph replay, and a CPU torch op costs several microseconds of
        dispatch where numpy's costs one. On the 2-core dev VM it takes 10-12 µs at batch 1 to 256, where the seven
        torch ops and the caller's int32 cast it replaced took 26-43 µs."""
        lengths = context_tokens.numpy() if isinstance(context_tokens, torch.Tensor) else np.asarray(context_tokens)
        pages = (lengths + (page_size - 1)) // page_size
        indptr = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr[1:])
        last_page_len = (lengths - (pages - 1) * page_size).astype(np.int32)
        return cls(torch.from_numpy(indptr), torch.from_numpy(last_page_len), int(indptr[-1]))


@dataclass(frozen=True)
class ExtendLengths:
    """One extend plan's request rows as host lists: new tokens and context tokens (prefix + new) per row."""

    new_tokens: list[int]
    context_tokens: list[int]

    @classmethod
    def of(cls, batch: ForwardBatch, padded_rows: int = 0) -> ExtendLengths:
        """The real requests of ``batch``, then ``padded_rows`` padding rows (no new token, one scratch token: the
        ``seq_len`` fill value the runner's static buffers give a padded request)."""
        if batch.extend_seq_lens_cpu is None or batch.extend_prefix_lens_cpu is None:
            raise ValueError("an extend batch needs extend_seq_lens_cpu and extend_prefix_lens_cpu")
        new = list(batch.extend_seq_lens_cpu)
        context = [n + p for n, p in zip(new, batch.extend_prefix_lens_cpu, strict=True)]
        return cls(new + [0] * padded_rows, context + [1] * padded_rows)

    def qo_indptr(self) -> torch.Tensor:
        """[rows + 1] int32 (CPU): row ``r``'s new tokens are query rows ``qo_indptr[r]:qo_indptr[r + 1]``."""
        indptr = torch.zeros(len(self.new_tokens) + 1, dtype=torch.int32)
        torch.cumsum(torch.tensor(self.new_tokens, dtype=torch.int32), 0, out=indptr[1:])
        return indptr

    def host_pages(self, page_size: int) -> HostPages:
        """The rows' pages, from their context lengths."""
        return HostPages.of(self.context_tokens, page_size)


def lay_out_pages(
    indices: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    pages_per_row: int,
    page_counts: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Write each row's page ids back to back into ``indices`` (device ops of fixed shape, no sync).

    With ``page_counts`` (``indptr`` [rows + 1] and ``last_page_len`` [rows], int32 device buffers), also write
    what ``HostPages.of(seq_lens)`` holds into them, ``indptr[0]`` left as it is (0). A graph step that writes these
    itself needs no host-to-device copy of them when it is re-planned: only the host side of the plan changes.

    Row ``r`` (request-to-token row ``req_pool_indices[r]``, ``seq_lens[r]`` tokens) has pages
    ``req_to_token[row, j * page_size] // page_size`` for ``j < ceil(seq_lens[r] / page_size)``; the first
    ``pages_per_row`` columns of every row are read, and entries past a row's pages go to ``indices[-1]``, a dump
    target the caller leaves out of the plan.
    """
    page_table = req_to_token[:, : pages_per_row * page_size : page_size].index_select(0, req_pool_indices)
    if page_size > 1:
        page_table = page_table // page_size
    pages = (seq_lens + (page_size - 1)) // page_size
    ends = torch.cumsum(pages, 0, dtype=torch.int64)
    starts = ends - pages
    if page_counts is not None:
        indptr, last_page_len = page_counts
        indptr[1:].copy_(ends)
        last_page_len.copy_(seq_lens - (pages - 1) * page_size)
    columns = torch.arange(pages_per_row, device=indices.device)
    targets = torch.where(columns[None, :] < pages[:, None], starts[:, None] + columns, indices.numel() - 1)
    indices.scatter_(0, targets.reshape(-1), page_table.reshape(-1).to(indices.dtype))
