"""``LoraForwardHost``: the model runner as the graph runners of the LoRA variant see it.

A graph runner captures, replays eagerly and (on the CPU test double) re-runs ``forward`` of the model runner it is
given. Handing the LoRA variant's runners this view instead of the model runner itself makes every forward they run
apply the adapters (``ModelRunner.lora_forward``), whenever it runs: eager capture, lazy capture on first use, capture
again on wake, eager fallback. Everything else (attention backend, device, request table, the tensors the graphs
read) is the model runner's own, so both variants share the attention backend and the KV cache.
"""

from __future__ import annotations

from typing import Any

import torch

from cudagraph.runner import AttentionBackendLike, ForwardBatch, ReqToTokenPoolLike


class LoraForwardHost:
    """``model_runner`` with a forward that applies the step's adapters."""

    def __init__(self, model_runner: Any) -> None:
        self.model_runner = model_runner
        self.device: torch.device = model_runner.device
        self.dtype: torch.dtype = model_runner.dtype

    @property
    def attn_backend(self) -> AttentionBackendLike:
        """The model runner's attention backend."""
        return self.model_runner.attn_backend  # type: ignore[no-any-return]

    @property
    def req_to_token_pool(self) -> ReqToTokenPoolLike:
        """The model runner's request-to-token table."""
        return self.model_runner.req_to_token_pool  # type: ignore[no-any-return]

    @property
    def model(self) -> Any:
        """The model runner's model."""
        return self.model_runner.model

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """The model runner's forward of ``batch`` with the adapters applied."""
        return self.model_runner.lora_forward(batch)  # type: ignore[no-any-return]

    def model_forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The model runner's ``model_forward`` (the part a compiling backend traces; it runs inside ``forward``, so
        with the adapters on)."""
        return self.model_runner.model_forward(input_ids, positions)  # type: ignore[no-any-return]

    def graph_read_tensors(self) -> dict[str, torch.Tensor]:
        """What the graphs read beyond the runners' static buffers (the model runner's, the LoRA slots included)."""
        return self.model_runner.graph_read_tensors()  # type: ignore[no-any-return]
