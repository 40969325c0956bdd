"""``LoraStep``: what changes from one step to the next, kept where captured graphs read it.

``indices`` is a persistent device tensor of per-token slot indices (``AdapterSlots.none_index`` for a token without
an adapter), written (``copy_``) before every forward that applies adapters: a decode step writes one index per
request, an extend step repeats each request's index over its tokens. ``scales`` holds each token's row of the
slots' ``scale_table`` (its slot's scaling over its ranks, zeros elsewhere): ``gather_scales`` fills it from
``indices`` once per forward, inside what a graph captures (before the model forward), so the layers read it
instead of gathering it again in every projection. ``active`` is the host switch the layers read while a forward
is traced or captured: on, the forward applies the adapters; off, it is the plain model's. It is on only inside
``applying()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from .config import LoraError


class LoraStep:
    """Per-token adapter indices and scales for up to ``capacity`` tokens a step, over ``scale_table``
    ``[slots + 1, slots * max_rank]`` (its last row, all zeros, is the no-adapter row)."""

    def __init__(self, capacity: int, scale_table: torch.Tensor) -> None:
        self.capacity = capacity
        self.scale_table = scale_table
        self.none_index = scale_table.shape[0] - 1
        """The index of a token without an adapter."""
        device = scale_table.device
        self.indices = torch.full((capacity,), self.none_index, dtype=torch.int64, device=device)
        """Slot index per token of the current step (rows past the step's tokens: stale but valid indices)."""
        self.scales = torch.zeros((capacity, scale_table.shape[1]), dtype=scale_table.dtype, device=device)
        """Per token of the current forward: its row of ``scale_table`` (``gather_scales``)."""
        self.active = False
        """Whether the forward now running applies adapters (read by the layers, on the host)."""

    def write(self, per_token: Sequence[int]) -> None:
        """Write the step's per-token slot indices into ``indices`` (one host-to-device copy)."""
        if len(per_token) > self.capacity:
            raise LoraError(
                f"a step of {len(per_token)} tokens exceeds the LoRA index buffer ({self.capacity} tokens): build the "
                "model runner with more KV slots (a step's new tokens each take one)"
            )
        if per_token:
            host = torch.tensor(per_token, dtype=torch.int64)
            self.indices[: len(per_token)].copy_(host, non_blocking=self.indices.is_cuda)

    def gather_scales(self, num_tokens: int) -> None:
        """Fill the first ``num_tokens`` rows of ``scales`` from ``indices`` (one kernel, no host sync)."""
        torch.index_select(self.scale_table, 0, self.indices[:num_tokens], out=self.scales[:num_tokens])

    @contextlib.contextmanager
    def applying(self) -> Iterator[None]:
        """Forwards inside apply the adapters (captures of the LoRA variant, its eager steps, its CPU replays)."""
        before, self.active = self.active, True
        try:
            yield
        finally:
            self.active = before
