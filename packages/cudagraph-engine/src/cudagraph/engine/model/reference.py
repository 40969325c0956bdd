"""Dense reference attention and generation for one causal sequence: the yardstick paged attention backends and
graphed runs are compared against. Not for serving: it recomputes the whole sequence every step."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .architecture import ModelConfig
from .causal_lm import CausalLM
from .layers import AttendFn


def dense_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, num_heads: int, num_kv_heads: int, scale: float
) -> torch.Tensor:
    """Causal grouped-query attention over one sequence: ``q`` ``[T, num_heads * D]``, ``k``/``v``
    ``[T, num_kv_heads * D]`` (any row stride) -> ``[T, num_heads * D]``, through ``scaled_dot_product_attention``
    with each kv head repeated for its query group."""
    tokens = q.shape[0]
    head_dim = q.shape[1] // num_heads
    group = num_heads // num_kv_heads
    query = q.reshape(tokens, num_heads, head_dim).transpose(0, 1).unsqueeze(0)
    key = k.reshape(tokens, num_kv_heads, head_dim).transpose(0, 1).repeat_interleave(group, dim=0).unsqueeze(0)
    value = v.reshape(tokens, num_kv_heads, head_dim).transpose(0, 1).repeat_interleave(group, dim=0).unsqueeze(0)
    out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale)
    return out.squeeze(0).transpose(0, 1).reshape(tokens, num_heads * head_dim)


def dense_attend(config: ModelConfig) -> AttendFn:
    """An ``attend`` for ``CausalLM.forward`` when the step's tokens are one whole sequence from position 0."""

    def attend(layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return dense_causal_attention(
            q, k, v, num_heads=config.num_heads, num_kv_heads=config.num_kv_heads, scale=config.attention_scale
        )

    return attend


@torch.inference_mode()
def reference_logits(model: CausalLM, token_ids: list[int] | torch.Tensor) -> torch.Tensor:
    """Float32 logits ``[T, vocab]`` at every position of one sequence, computed densely from position 0."""
    ids = torch.as_tensor(token_ids, dtype=torch.int64, device=model.device)
    positions = torch.arange(ids.shape[0], dtype=torch.int64, device=model.device)
    return model.compute_logits(model(ids, positions, dense_attend(model.local_config)))


def reference_greedy(model: CausalLM, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation of one prompt, recomputing the whole sequence each step (no KV cache): the tokens a
    cached or graphed engine must reproduce."""
    sequence = list(prompt_ids)
    for _ in range(max_new_tokens):
        sequence.append(int(reference_logits(model, sequence)[-1].argmax()))
    return sequence[len(prompt_ids) :]
