"""The paged KV cache: a request-to-token table and a token-to-KV pool allocated in pages of ``page_size`` tokens.

A KV slot is ``page * page_size + offset``. The request-to-token table maps each token to its slot, so attention in
plain torch gathers by slot whatever the page size, and a paged kernel (FlashInfer) reads a request's pages as
``slot // page_size`` of every ``page_size``-th entry. Keys and values are stored by flat slot (``out_cache_loc``).

Request row ``PADDING_REQ_POOL_INDEX`` and the page holding ``PADDING_KV_SLOT`` are scratch: graph padding points
there, so the allocators never hand them out. Allocation is host-side bookkeeping only; no device work, no syncs.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from cudagraph.runner import PADDING_KV_SLOT, PADDING_REQ_POOL_INDEX

COLUMN_ALIGNMENT = 16
"""Request-to-token rows are padded to a multiple of this many columns (or of the page size, if larger)."""

MAX_PAGE_SIZE = 128
"""The largest page size the cache accepts (FlashInfer's paged kernels are built and tested up to here)."""

SCRATCH_PAGE = PADDING_KV_SLOT
"""The page that holds the scratch slot (slot 0 is offset 0 of page 0)."""


class CacheFullError(RuntimeError):
    """The KV cache has no room for a request: the message says what was asked and what is free."""


def check_page_size(page_size: int) -> int:
    """``page_size`` when it is a power of two up to ``MAX_PAGE_SIZE``; a ``ValueError`` naming what is allowed."""
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size={page_size!r} is not a positive integer; allowed: 1, 2, 4, ... {MAX_PAGE_SIZE}")
    if page_size & (page_size - 1) or page_size > MAX_PAGE_SIZE:
        raise ValueError(
            f"page_size={page_size} is not a power of two up to {MAX_PAGE_SIZE}; allowed: 1, 2, 4, ... {MAX_PAGE_SIZE}"
        )
    return page_size


def pages_for(num_tokens: int, page_size: int) -> int:
    """How many pages ``num_tokens`` tokens take."""
    return -(-num_tokens // page_size)


@dataclass(frozen=True)
class ReqToTokenEdit:
    """One change to the request-to-token table: ``slots`` written at ``row`` from column ``start``, or, when
    ``slots`` is ``None``, ``row`` freed (reset to the scratch slot)."""

    row: int
    start: int = 0
    slots: torch.Tensor | None = None
    """CPU int32 slots."""


class ReqToTokenPool:
    """``req_to_token[row, i]`` is the KV slot of token ``i`` of the request in ``row``; row 0 is scratch.

    ``start_recording()`` keeps every write and free as a ``ReqToTokenEdit`` until ``take_edits()``: the rank that
    schedules a tensor-parallel group sends them along with each step, and the other ranks ``apply`` them, so every
    rank's table stays the same without any rank scheduling twice.
    """

    def __init__(
        self, max_num_reqs: int, max_context_len: int, device: torch.device | str, *, page_size: int = 1
    ) -> None:
        if max_num_reqs < 1 or max_context_len < 1:
            raise ValueError(
                f"max_num_reqs={max_num_reqs} and max_context_len={max_context_len} must both be at least 1"
            )
        self.max_num_reqs = max_num_reqs
        self.max_context_len = max_context_len
        self.page_size = check_page_size(page_size)
        # One extra row: the scratch row padded graph rows read (it stays all PADDING_KV_SLOT). The width is rounded
        # up to a multiple of COLUMN_ALIGNMENT so attention masks over a full row need no padding in fused kernels,
        # and to whole pages so a row's page table has a fixed width.
        alignment = max(COLUMN_ALIGNMENT, self.page_size)
        width = -(-max_context_len // alignment) * alignment
        self.req_to_token = torch.full((max_num_reqs + 1, width), PADDING_KV_SLOT, dtype=torch.int32, device=device)
        self._free_rows: deque[int] = deque(row for row in range(max_num_reqs + 1) if row != PADDING_REQ_POOL_INDEX)
        self._edits: list[ReqToTokenEdit] | None = None

    @property
    def max_pages_per_request(self) -> int:
        """Pages in one full row of the table."""
        return int(self.req_to_token.shape[1]) // self.page_size

    @property
    def available(self) -> int:
        """Rows that can still be allocated."""
        return len(self._free_rows)

    def alloc(self) -> int:
        """One free row (never the scratch row)."""
        if not self._free_rows:
            raise CacheFullError(f"all {self.max_num_reqs} request rows are in use; free a finished request first")
        return self._free_rows.popleft()

    def free(self, row: int) -> None:
        """Return ``row``; its slots are reset to the scratch slot so a stale read can only hit scratch."""
        if row == PADDING_REQ_POOL_INDEX or not 0 < row <= self.max_num_reqs:
            raise ValueError(f"request row {row} is not one this pool hands out (1..{self.max_num_reqs})")
        self.req_to_token[row].fill_(PADDING_KV_SLOT)
        self._free_rows.append(row)
        if self._edits is not None:
            self._edits.append(ReqToTokenEdit(row))

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Record that tokens ``start .. start + len(slots)`` of the request in ``row`` live in ``slots``."""
        stop = start + int(slots.numel())
        if stop > self.max_context_len:
            raise CacheFullError(f"a request of {stop} tokens exceeds max_context_len={self.max_context_len}")
        self.req_to_token[row, start:stop] = slots.to(device=self.req_to_token.device, dtype=torch.int32)
        if self._edits is not None:
            self._edits.append(ReqToTokenEdit(row, start, slots.to(device="cpu", dtype=torch.int32)))

    def start_recording(self) -> None:
        """Keep every later write and free as an edit, until ``take_edits``."""
        self._edits = []

    def take_edits(self) -> list[ReqToTokenEdit]:
        """The edits recorded since the last call (none unless recording)."""
        if not self._edits:
            return []
        edits, self._edits = self._edits, []
        return edits

    def apply(self, edit: ReqToTokenEdit) -> None:
        """Make the same change another rank's pool recorded (the table only: this pool hands out no rows)."""
        if edit.slots is None:
            self.req_to_token[edit.row].fill_(PADDING_KV_SLOT)
        else:
            stop = edit.start + int(edit.slots.numel())
            self.req_to_token[edit.row, edit.start : stop] = edit.slots.to(self.req_to_token.device)


class TokenToKVPool:
    """Keys and values of every cached token, in pages; page 0 (which holds the scratch slot) is never handed out.

    Per layer one ``kv_pages`` tensor ``[num_pages + 1, page_size, 2, num_kv_heads, head_dim]`` holds each slot's key
    and value side by side. ``kv_buffer[layer]`` is the same storage seen by flat slot,
    ``[(num_pages + 1) * page_size, 2, num_kv_heads, head_dim]``, so one gather fetches both and stores index it by
    ``out_cache_loc``; ``k_buffer[layer]`` and ``v_buffer[layer]`` are its ``[:, 0]`` and ``[:, 1]`` views. The free
    list (of pages) lives on the host, so allocating never touches the device.
    """

    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        *,
        page_size: int = 1,
    ) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots} must be at least 1")
        self.page_size = check_page_size(page_size)
        self.num_pages = pages_for(num_slots, self.page_size)
        self.num_slots = self.num_pages * self.page_size
        """Slots that can be handed out: ``num_slots`` rounded up to whole pages."""
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        shape = (self.num_pages + 1, self.page_size, 2, num_kv_heads, head_dim)
        self.kv_pages = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.kv_buffer = [pages.view(-1, 2, num_kv_heads, head_dim) for pages in self.kv_pages]
        self.k_buffer = [kv[:, 0] for kv in self.kv_buffer]
        self.v_buffer = [kv[:, 1] for kv in self.kv_buffer]
        pages = [page for page in range(self.num_pages + 1) if page != SCRATCH_PAGE]
        self._free_pages = torch.tensor(pages, dtype=torch.int64)
        self._free_page_count = self.num_pages
        self._offsets = torch.arange(self.page_size, dtype=torch.int64)

    @property
    def available(self) -> int:
        """Slots that can still be allocated (whole free pages)."""
        return self._free_page_count * self.page_size

    def alloc(self, count: int) -> torch.Tensor:
        """Slots for ``count`` tokens (a CPU int64 tensor, in token order): whole pages, token ``i`` at offset
        ``i % page_size`` of page ``i // page_size``; never the scratch page."""
        num_pages = pages_for(count, self.page_size)
        if num_pages > self._free_page_count:
            raise CacheFullError(
                f"asked for {count} KV slots but only {self.available} of {self.num_slots} are free "
                f"(whole pages of {self.page_size}: {num_pages} needed)"
            )
        start = self.num_pages - self._free_page_count
        self._free_page_count -= num_pages
        pages = self._free_pages[start : start + num_pages]
        return (pages[:, None] * self.page_size + self._offsets[None, :]).flatten()[:count]

    def free(self, slots: torch.Tensor) -> None:
        """Return the pages of ``slots`` (every slot of a request, as ``alloc`` gave them) to the pool."""
        pages = slots.cpu()[:: self.page_size] // self.page_size
        count = int(pages.numel())
        start = self.num_pages - self._free_page_count - count
        self._free_pages[start : start + count] = pages
        self._free_page_count += count

    def store(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write keys and values ``[T, num_kv_heads * head_dim]`` into ``slots`` ``[T]`` of layer ``layer_id``, both
        with one kernel when ``v`` follows ``k`` in every row of one tensor (the model's fused projection), else
        with one more to pair them up. Padded tokens all point at the scratch slot, which any of them may win."""
        self.kv_buffer[layer_id].index_put_((slots,), self._paired(k, v))

    def bind_store(
        self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[Callable[[], object], ...]:
        """``store(layer_id, slots, k, v)`` bound now, as the calls to run in order, for a replay whose ``slots``,
        ``k`` and ``v`` are the same tensors at every step: the layer's cache and the pairing of ``k`` and ``v`` are
        looked up once, so a step makes one ``index_put_`` where they sit side by side, else one stack into a buffer
        kept for it and the ``index_put_``. The caller runs them with its own calls (no wrapper frame per step)."""
        destination = self.kv_buffer[layer_id]
        if self._side_by_side(k, v):
            return (functools.partial(destination.index_put_, (slots,), self._paired(k, v)),)
        heads = (k.shape[0], self.num_kv_heads, self.head_dim)
        try:
            k_heads, v_heads = k.view(heads), v.view(heads)
        except RuntimeError:  # no view of these strides: pair them at every step, as an eager store does
            return (functools.partial(self.store, layer_id, slots, k, v),)
        paired = torch.empty((k.shape[0], 2, self.num_kv_heads, self.head_dim), dtype=k.dtype, device=k.device)
        stack = functools.partial(torch.stack, (k_heads, v_heads), dim=1, out=paired)
        return stack, functools.partial(destination.index_put_, (slots,), paired)

    def _side_by_side(self, k: torch.Tensor, v: torch.Tensor) -> bool:
        rows, width = k.shape
        return (
            v.shape == k.shape
            and v.dtype == k.dtype
            and k.stride(1) == v.stride(1) == 1
            and (k.stride(0) == v.stride(0) or rows == 1)  # one row: its stride is never used
            and v.data_ptr() == k.data_ptr() + width * k.element_size()
        )

    def _paired(self, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``k`` and ``v`` as one ``[T, 2, num_kv_heads, head_dim]`` tensor: a view of their memory where they
        sit side by side (no copy), else a stacked copy."""
        rows, width = k.shape
        if self._side_by_side(k, v):
            # Element [t, 0, h, d] is k[t, h * D + d] and [t, 1, h, d] is v[t, h * D + d], by the checks above.
            return k.as_strided((rows, 2, self.num_kv_heads, self.head_dim), (k.stride(0), width, self.head_dim, 1))
        heads = (rows, self.num_kv_heads, self.head_dim)
        return torch.stack((k.reshape(heads), v.reshape(heads)), dim=1)

    def kv_bytes(self) -> int:
        """Device bytes the keys and values take."""
        return sum(t.numel() * t.element_size() for t in self.kv_pages)
