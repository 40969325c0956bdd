"""``LoraStep``: what changes from one step to the next, kept where captured graphs read it.

``indices`` is a persistent device tensor of per-token slot indices (``AdapterSlots.none_index`` for a token without
an adapter), written (``copy_``) before every forward that applies adapters: a decode step writes one index per
request, an extend step repeats each request's index over its tokens. ``active`` is the host switch the layers read
while a forward is traced or captured: on, the forward applies the adapters; off, it is the plain model's. It is on
only inside ``applying()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from .config import LoraError


class LoraStep:
    """Per-token adapter indices for up to ``capacity`` tokens a step, on ``device``."""

    def __init__(self, capacity: int, none_index: int, device: torch.device) -> None:
        self.capacity = capacity
        self.none_index = none_index
        self.indices = torch.full((capacity,), none_index, dtype=torch.int64, device=device)
        """Slot index per token of the current step (rows past the step's tokens: stale but valid indices)."""
        self.active = False
        """Whether the forward now running applies adapters (read by the layers, on the host)."""

    def write(self, per_token: Sequence[int]) -> None:
        """Write the step's per-token slot indices into ``indices`` (one host-to-device copy)."""
        if len(per_token) > self.capacity:
            raise LoraError(
                f"a step of {len(per_token)} tokens exceeds the LoRA index buffer ({self.capacity} tokens): build the "
                "model runner with a larger cache (max_num_reqs * max_context_len bounds a step)"
            )
        if per_token:
            host = torch.tensor(per_token, dtype=torch.int64)
            self.indices[: len(per_token)].copy_(host, non_blocking=self.indices.is_cuda)

    @contextlib.contextmanager
    def applying(self) -> Iterator[None]:
        """Forwards inside apply the adapters (captures of the LoRA variant, its eager steps, its CPU replays)."""
        before, self.active = self.active, True
        try:
            yield
        finally:
            self.active = before
