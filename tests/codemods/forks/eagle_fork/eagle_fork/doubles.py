"""CPU doubles of the fork's EAGLE worker and its draft model runner, for the fork's tests.

The draft model runner is a one-layer head that reads what a real one reads (tokens, positions, the hidden states
handed to it, a KV cache written at ``out_cache_loc`` and read through ``req_to_token``), with what SGLang's EAGLE
runners read of it (``server_args.cuda_graph_bs``, ``draft_attn_backend``) and what cudagraph's draft runners read
(``draft_forward(batch, attn_backend)``, one attention backend a step: ``DraftModelRunnerLike``). The worker holds
what the fork's engine holds: the draft step count, and, read only by the builder once the fork runs cudagraph's
runners, the graph config and a CPU backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

DECODE, TARGET_VERIFY = 1, 4
"""The forward modes of a draft step and of a draft extend (SGLang's and cudagraph's ``ForwardMode`` values)."""


class CpuAttention:
    """Attention hooks with nothing to plan on the CPU."""

    def init_forward_metadata(self, batch) -> None:
        pass

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        pass

    def init_forward_metadata_capture_cuda_graph(self, *args, **kwargs) -> None:
        pass

    def init_forward_metadata_replay_cuda_graph(self, *args, **kwargs) -> None:
        pass

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1


class CpuDraftModelRunner:
    """``h = tanh(E[token] + P[position] + hidden @ M + 0.5 * mean of the visible cache rows)``, logits ``h @ O``."""

    device = torch.device("cpu")
    dtype = torch.float32

    def __init__(self, buckets: tuple[int, ...], steps: int, vocab: int = 32, hidden_size: int = 8) -> None:
        generator = torch.Generator().manual_seed(0)
        rows, width = max(buckets) + 1, 64
        self.vocab, self.hidden_size = vocab, hidden_size
        self.embed = torch.randn(vocab, hidden_size, generator=generator)
        self.position_embed = torch.randn(width, hidden_size, generator=generator) * 0.3
        self.mix = torch.randn(hidden_size, hidden_size, generator=generator) * 0.5
        self.head = torch.randn(hidden_size, vocab, generator=generator)
        self.kv = torch.zeros(rows * width + 1, hidden_size)
        table = torch.zeros(rows + 1, width, dtype=torch.int32)
        for row in range(1, rows + 1):
            table[row] = torch.arange(width, dtype=torch.int32) + 1 + (row - 1) * width
        self.req_to_token_pool = SimpleNamespace(req_to_token=table)
        self.server_args = SimpleNamespace(cuda_graph_bs=list(buckets))
        self.attn_backend = self.draft_attn_backend = CpuAttention()
        self.step_attn_backends = [CpuAttention() for _ in range(steps)]

    def forward(self, batch):
        raise AssertionError("draft runners call draft_forward")

    def draft_forward(self, batch, attn_backend) -> tuple[torch.Tensor, torch.Tensor]:
        h0 = self.embed[batch.input_ids] + self.position_embed[batch.positions] + batch.hidden_states @ self.mix
        self.kv.index_copy_(0, batch.out_cache_loc, h0)
        width = self.req_to_token_pool.req_to_token.shape[1]
        slots = self.req_to_token_pool.req_to_token[batch.req_pool_indices].long()
        query_len = batch.num_tokens // max(batch.batch_size, 1)
        last = batch.seq_lens[:, None].long() - query_len + torch.arange(query_len)[None, :]
        visible = torch.arange(width)[None, None, :] <= last[:, :, None]
        rows = self.kv[slots]
        attended = (visible[..., None] * rows[:, None]).sum(2) / visible.sum(2, keepdim=True).clamp_min(1)
        hidden = torch.tanh(h0 + 0.5 * attended.reshape(-1, self.hidden_size))
        return hidden @ self.head, hidden


class CpuEagleWorker:
    """The fork's EAGLE worker, as far as its draft runners read it."""

    def __init__(self, buckets: tuple[int, ...] = (1, 2, 4, 8, 16), speculative_num_steps: int = 2) -> None:
        self.speculative_num_steps = speculative_num_steps
        self.model_runner = CpuDraftModelRunner(buckets, speculative_num_steps)
        self.buckets = buckets

    def draft_forward(self, forward_batch):
        return self.model_runner.draft_forward(forward_batch, self.model_runner.draft_attn_backend)

    @property
    def graph_config(self):
        """The decode phase's graph config (what the fork's engine resolves once it runs cudagraph's runners)."""
        from cudagraph.config import Backend, PhaseConfig

        return PhaseConfig(Backend.FULL, self.buckets, max(self.buckets))

    def graph_backend(self):
        """A CPU stand-in of the ``full`` backend (the tests run without CUDA)."""
        from cudagraph.backend.testing import CpuReplayBackend
        from cudagraph.config import Backend

        return CpuReplayBackend(Backend.FULL)


@dataclass
class StepShape:
    """What ``can_run`` reads of a batch: its mode, its request count and its token count."""

    forward_mode: int
    batch_size: int
    num_tokens: int


def decode_batch(size: int) -> StepShape:
    """A draft step of ``size`` requests."""
    return StepShape(DECODE, size, size)


def verify_batch(size: int, query_len: int = 3) -> StepShape:
    """A draft extend of ``size`` requests, ``query_len`` rows each (the worker's two steps, plus one)."""
    return StepShape(TARGET_VERIFY, size, size * query_len)
