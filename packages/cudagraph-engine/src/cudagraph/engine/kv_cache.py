"""The paged KV cache: a request-to-token table and a token-to-KV pool with one slot per token.

Request row ``PADDING_REQ_POOL_INDEX`` and KV slot ``PADDING_KV_SLOT`` are scratch: graph padding points there, so
the allocators never hand them out. Allocation is host-side bookkeeping only; no device work, no syncs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from cudagraph.runner import PADDING_KV_SLOT, PADDING_REQ_POOL_INDEX

COLUMN_ALIGNMENT = 16
"""Request-to-token rows are padded to a multiple of this many columns."""


class CacheFullError(RuntimeError):
    """The KV cache has no room for a request: the message says what was asked and what is free."""


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

    def __init__(self, max_num_reqs: int, max_context_len: int, device: torch.device | str) -> None:
        if max_num_reqs < 1 or max_context_len < 1:
            raise ValueError(
                f"max_num_reqs={max_num_reqs} and max_context_len={max_context_len} must both be at least 1"
            )
        self.max_num_reqs = max_num_reqs
        self.max_context_len = max_context_len
        # One extra row: the scratch row padded graph rows read (it stays all PADDING_KV_SLOT). The width is rounded
        # up to a multiple of COLUMN_ALIGNMENT so attention masks over a full row need no padding in fused kernels.
        width = -(-max_context_len // COLUMN_ALIGNMENT) * COLUMN_ALIGNMENT
        self.req_to_token = torch.full((max_num_reqs + 1, width), PADDING_KV_SLOT, dtype=torch.int32, device=device)
        self._free_rows: deque[int] = deque(row for row in range(max_num_reqs + 1) if row != PADDING_REQ_POOL_INDEX)
        self._edits: list[ReqToTokenEdit] | None = None

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
    """Keys and values of every cached token; slot 0 is scratch.

    Per layer one ``kv_buffer`` ``[num_slots + 1, 2, num_kv_heads, head_dim]`` holds a slot's key and value side by
    side, so one gather fetches both; ``k_buffer[layer]`` and ``v_buffer[layer]`` are its ``[:, 0]`` and ``[:, 1]``
    views. The free list lives on the host, so allocating never touches the device.
    """

    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots} must be at least 1")
        self.num_slots = num_slots
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        shape = (num_slots + 1, 2, num_kv_heads, head_dim)
        self.kv_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.k_buffer = [kv[:, 0] for kv in self.kv_buffer]
        self.v_buffer = [kv[:, 1] for kv in self.kv_buffer]
        self._free_slots = torch.tensor([s for s in range(num_slots + 1) if s != PADDING_KV_SLOT], dtype=torch.int64)
        self._free_count = num_slots

    @property
    def available(self) -> int:
        """Slots that can still be allocated."""
        return self._free_count

    def alloc(self, count: int) -> torch.Tensor:
        """``count`` free slots (a CPU int64 tensor), never the scratch slot."""
        if count > self._free_count:
            raise CacheFullError(f"asked for {count} KV slots but only {self._free_count} of {self.num_slots} are free")
        start = self.num_slots - self._free_count
        self._free_count -= count
        return self._free_slots[start : start + count].clone()

    def free(self, slots: torch.Tensor) -> None:
        """Return ``slots`` to the pool."""
        count = int(slots.numel())
        start = self.num_slots - self._free_count - count
        self._free_slots[start : start + count] = slots.cpu()
        self._free_count += count

    def kv_bytes(self) -> int:
        """Device bytes the keys and values take."""
        return sum(t.numel() * t.element_size() for t in self.kv_buffer)
