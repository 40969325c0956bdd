"""A batch-1 greedy decode step of the model alone, on static buffers, that a CUDA graph can capture whole.

No paged cache, no attention backend, no runner: a single-sequence KV cache with static shapes (``StaticKVCache``)
and a step that reads its input token and position from device buffers and writes the next token back
(``DecodeStep``), so the same graph replays every step. Tests use it to check that a captured step replays bitwise
what eager computes; ``bench/bench_model_step.py`` times it. For tests and benchmarks, never for production.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from .model import CausalLM, ModelConfig

__all__ = ["DecodeStep", "StaticKVCache", "capture_step"]


class StaticKVCache:
    """A single-sequence KV cache with static shapes: ``attend`` writes this step's k/v at ``positions`` and attends
    over the whole cache with a positional mask, so a decode step has the same shapes at every position."""

    def __init__(self, config: ModelConfig, max_len: int, dtype: torch.dtype, device: str = "cuda") -> None:
        self.config = config
        shape = (config.num_layers, max_len, config.num_kv_heads, config.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.slots = torch.arange(max_len, device=device)
        self.positions = torch.zeros(1, dtype=torch.int64, device=device)

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store this step's ``k``/``v`` of layer ``layer_id`` and attend ``q`` over the cache up to its position."""
        config, tokens = self.config, q.shape[0]
        self.keys[layer_id].index_copy_(0, self.positions, k.reshape(tokens, config.num_kv_heads, -1))
        self.values[layer_id].index_copy_(0, self.positions, v.reshape(tokens, config.num_kv_heads, -1))
        mask = self.slots[None, :] <= self.positions[:, None]
        out = F.scaled_dot_product_attention(
            q.reshape(tokens, config.num_heads, -1).transpose(0, 1)[None],
            self.keys[layer_id].transpose(0, 1)[None],
            self.values[layer_id].transpose(0, 1)[None],
            attn_mask=mask[None, None],
            scale=config.attention_scale,
            enable_gqa=True,
        )
        return out[0].transpose(0, 1).reshape(tokens, -1)


class DecodeStep:
    """One batch-1 greedy decode step on static buffers: reads ``input_ids``/``cache.positions``, writes the
    next token into ``input_ids`` and advances the position (unless ``advance`` is off, for timing loops that
    must stay inside the cache), all on the device so that it can be replayed. ``attend`` replaces the cache's
    attention (``lambda layer_id, q, k, v: q`` times the model without it)."""

    def __init__(
        self, model: CausalLM, cache: StaticKVCache, attend: Callable | None = None, *, advance: bool = True
    ) -> None:
        self.model, self.cache, self.advance = model, cache, advance
        self.attend = attend or cache.attend
        device = cache.positions.device
        self.input_ids = torch.zeros(1, dtype=torch.int64, device=device)
        self.logits = torch.zeros(1, model.config.vocab_size, device=device)

    def prefill(self, prompt: list[int]) -> None:
        """Run ``prompt`` through the model into the cache; ``input_ids`` then holds its greedy next token."""
        device = self.cache.positions.device
        self.cache.positions = torch.arange(len(prompt), device=device)
        hidden = self.model(torch.tensor(prompt, device=device), self.cache.positions, self.cache.attend)
        self.input_ids.copy_(self.model.compute_logits(hidden[-1:]).argmax(-1))
        self.cache.positions = torch.full((1,), len(prompt), dtype=torch.int64, device=device)

    def __call__(self) -> None:
        """One step: the next token of ``input_ids`` at ``cache.positions``, written back to ``input_ids``."""
        hidden = self.model(self.input_ids, self.cache.positions, self.attend)
        self.logits.copy_(self.model.compute_logits(hidden))
        self.input_ids.copy_(self.logits.argmax(-1))
        if self.advance:
            self.cache.positions.add_(1)


def capture_step(step: DecodeStep) -> torch.cuda.CUDAGraph:
    """``step`` captured in one CUDA graph (after two warm-up steps on a side stream), with the position and input
    token put back where they were, so the first replay computes what the next eager step would."""
    positions, input_ids = step.cache.positions.clone(), step.input_ids.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    # Warmup and capture advanced the state: put it back so the graph run starts where eager did.
    step.cache.positions.copy_(positions)
    step.input_ids.copy_(input_ids)
    return graph
