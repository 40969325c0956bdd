"""A draft model runner for the draft runners' CPU tests: a one-layer head small enough to capture per example, that
still reads everything a real one does (its tokens, positions, the hidden states handed to it, a KV cache written at
``out_cache_loc`` and read over each row's visible slots through ``req_to_token`` and ``seq_lens``), so a replay
that fed any of them wrongly gives other tokens than the eager chain.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from cudagraph.runner import ForwardBatch, ForwardMode, ReplayMetadata


class RecordingAttention:
    """Attention hooks that keep what the runner told them (each step's backend must see its own lengths)."""

    needs_seq_lens_cpu = True

    def __init__(self) -> None:
        self.captured: list[tuple[int, torch.Tensor]] = []
        self.replayed: list[ReplayMetadata] = []
        self.graph_rows = 0

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        pass

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.graph_rows = max_bs

    def init_forward_metadata_capture_cuda_graph(
        self, batch_size: int, num_tokens: int, req_pool_indices, seq_lens, forward_mode, **kwargs
    ) -> None:
        self.captured.append((batch_size, seq_lens))

    def init_forward_metadata_replay_cuda_graph(self, metadata: ReplayMetadata) -> None:
        self.replayed.append(metadata)

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1


class StubDraftModelRunner:
    """A ``DraftModelRunnerLike`` on the CPU: ``h = tanh(E[token] + P[position] + hidden @ M + 0.5 * attended)``,
    logits ``h @ O``, where ``attended`` is the mean of the cache rows the token sees (its request's slots before
    ``seq_len``, or in a verify-shaped step up to itself) after the token's own ``h0`` is written to its slot."""

    device = torch.device("cpu")
    dtype = torch.float32

    def __init__(
        self, vocab: int = 32, hidden_size: int = 8, steps: int = 4, rows: int = 16, width: int = 64, seed: int = 0
    ) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.vocab, self.hidden_size = vocab, hidden_size
        self.embed = torch.randn(vocab, hidden_size, generator=generator)
        self.position_embed = torch.randn(width, hidden_size, generator=generator) * 0.3
        self.mix = torch.randn(hidden_size, hidden_size, generator=generator) * 0.5
        self.head = torch.randn(hidden_size, vocab, generator=generator)
        self.kv = torch.zeros(rows * width + 1, hidden_size)
        table = torch.zeros(rows + 1, width, dtype=torch.int32)
        for row in range(1, rows + 1):  # row 0 is scratch (slot 0); row r owns a run of slots
            table[row] = torch.arange(width, dtype=torch.int32) + 1 + (row - 1) * width
        self.req_to_token_pool = SimpleNamespace(req_to_token=table)
        self.attn_backend = RecordingAttention()
        self.step_attn_backends = [RecordingAttention() for _ in range(steps)]
        self.forward_calls: list[ForwardMode] = []

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        raise AssertionError("the draft runners call draft_forward, never forward")

    def draft_forward(self, batch: ForwardBatch, attn_backend: object) -> tuple[torch.Tensor, torch.Tensor]:
        assert batch.hidden_states is not None
        self.forward_calls.append(batch.forward_mode)
        h0 = self.embed[batch.input_ids] + self.position_embed[batch.positions] + batch.hidden_states @ self.mix
        self.kv.index_copy_(0, batch.out_cache_loc, h0)
        width = self.req_to_token_pool.req_to_token.shape[1]
        slots = self.req_to_token_pool.req_to_token[batch.req_pool_indices].long()  # [B, W]
        query_len = batch.num_tokens // max(batch.batch_size, 1)
        # Token i of a request of seq_len tokens (query_len a request) sees slots 0 .. seq_len - query_len + i.
        last = batch.seq_lens[:, None].long() - query_len + torch.arange(query_len)[None, :]  # [B, Q]
        visible = torch.arange(width)[None, None, :] <= last[:, :, None]  # [B, Q, W]
        rows = self.kv[slots]  # [B, W, H]
        attended = (visible[..., None] * rows[:, None]).sum(2) / visible.sum(2, keepdim=True).clamp_min(1)
        hidden = torch.tanh(h0 + 0.5 * attended.reshape(-1, self.hidden_size))
        return hidden @ self.head, hidden


def draft_batch(
    model_runner: StubDraftModelRunner,
    size: int,
    *,
    query_len: int = 1,
    seed: int = 0,
    accepted: list[int] | None = None,
) -> ForwardBatch:
    """A decode-shaped (``query_len`` 1) or verify-shaped batch of ``size`` requests in rows 1 .. size, each with a
    random length of context already cached, random tokens and hidden states."""
    generator = torch.Generator().manual_seed(seed)
    prefix = torch.randint(2, 20, (size,), generator=generator)
    positions = (prefix[:, None] + torch.arange(query_len)[None, :]).reshape(-1)
    seq_lens = (prefix + query_len).int()
    rows = torch.arange(1, size + 1)
    table = model_runner.req_to_token_pool.req_to_token
    out_cache_loc = table[rows.repeat_interleave(query_len), positions].long()
    tokens = torch.randint(0, model_runner.vocab, (size * query_len,), generator=generator)
    hidden = torch.randn(size * query_len, model_runner.hidden_size, generator=generator)
    mode = ForwardMode.DECODE if query_len == 1 else ForwardMode.TARGET_VERIFY
    batch = ForwardBatch(
        mode, size, tokens, positions, seq_lens, rows, out_cache_loc, int(seq_lens.sum()), seq_lens.clone()
    )
    batch.hidden_states = hidden
    if query_len > 1:
        lens = accepted or torch.randint(1, query_len + 1, (size,), generator=generator).tolist()
        batch.accepted_lens = torch.tensor(lens, dtype=torch.int64)
    return batch
