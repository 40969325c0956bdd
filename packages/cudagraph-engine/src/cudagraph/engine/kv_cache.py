"""The paged KV cache: a request-to-token table and a token-to-KV pool with one slot per token.

Request row ``PADDING_REQ_POOL_INDEX`` and KV slot ``PADDING_KV_SLOT`` are scratch: graph padding points there, so
the allocators never hand them out. Allocation is host-side bookkeeping only; no device work, no syncs.
"""

from __future__ import annotations

from collections import deque

import torch

from cudagraph.runner import PADDING_KV_SLOT, PADDING_REQ_POOL_INDEX

COLUMN_ALIGNMENT = 16
"""Request-to-token rows are padded to a multiple of this many columns."""


class CacheFullError(RuntimeError):
    """The KV cache has no room for a request: the message says what was asked and what is free."""


class ReqToTokenPool:
    """``req_to_token[row, i]`` is the KV slot of token ``i`` of the request in ``row``; row 0 is scratch."""

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

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Record that tokens ``start .. start + len(slots)`` of the request in ``row`` live in ``slots``."""
        stop = start + int(slots.numel())
        if stop > self.max_context_len:
            raise CacheFullError(f"a request of {stop} tokens exceeds max_context_len={self.max_context_len}")
        self.req_to_token[row, start:stop] = slots.to(device=self.req_to_token.device, dtype=torch.int32)


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

    def store(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write keys and values ``[T, num_kv_heads * head_dim]`` into ``slots`` ``[T]`` of layer ``layer_id``, both
        with one kernel when ``v`` follows ``k`` in every row of one tensor (the model's fused projection), else
        with one more to pair them up. Padded tokens all point at the scratch slot, which any of them may win."""
        self.kv_buffer[layer_id].index_put_((slots,), self._paired(k, v))

    def _paired(self, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``k`` and ``v`` as one ``[T, 2, num_kv_heads, head_dim]`` tensor: a view of their memory where they
        sit side by side (no copy), else a stacked copy."""
        rows, width = k.shape
        side_by_side = (
            v.shape == k.shape
            and v.dtype == k.dtype
            and k.stride(1) == v.stride(1) == 1
            and (k.stride(0) == v.stride(0) or rows == 1)  # one row: its stride is never used
            and v.data_ptr() == k.data_ptr() + width * k.element_size()
        )
        if side_by_side:
            # Element [t, 0, h, d] is k[t, h * D + d] and [t, 1, h, d] is v[t, h * D + d], by the checks above.
            return k.as_strided((rows, 2, self.num_kv_heads, self.head_dim), (k.stride(0), width, self.head_dim, 1))
        heads = (rows, self.num_kv_heads, self.head_dim)
        return torch.stack((k.reshape(heads), v.reshape(heads)), dim=1)

    def kv_bytes(self) -> int:
        """Device bytes the keys and values take."""
        return sum(t.numel() * t.element_size() for t in self.kv_buffer)
