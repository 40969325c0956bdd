"""A small Llama-shaped bf16 decoder for the backend GPU tests, with attention as a registered break op.

The attention op (``torch.ops.cudagraph_backend_gpu_test.attention(q, k, v, output, layer_id)``) writes the step's
keys and values into a dense KV cache at each row's position and the attention result into ``output``; it reads the
positions and the cache from the forward context, as the engine's op does. It has no host syncs, so a full graph
captures it, and it is registered as a break point, so the breakable backend runs it eagerly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cudagraph.backend_utils import ForwardContext, get_forward_context, register_break_op, set_forward_context

_LIBRARY = torch.library.Library("cudagraph_backend_gpu_test", "DEF")
_LIBRARY.define("attention(Tensor q, Tensor k, Tensor v, Tensor(a!) output, int layer_id) -> ()")


@dataclass
class DecodeState:
    """What the attention op reads per step: each row's position (its KV slot in the dense cache)."""

    positions: torch.Tensor  # [B] int64


class DenseKVCache:
    """Keys and values per layer, row and position: ``[layers, rows, max_positions, kv_heads, head_dim]``."""

    def __init__(self, layers: int, rows: int, max_positions: int, kv_heads: int, head_dim: int, heads: int) -> None:
        shape = (layers, rows, max_positions, kv_heads, head_dim)
        generator = torch.Generator(device="cuda").manual_seed(1234)
        # Random history stands in for an earlier prefill, so attention has something to read.
        self.k = torch.randn(shape, device="cuda", generator=generator).to(torch.bfloat16)
        self.v = torch.randn(shape, device="cuda", generator=generator).to(torch.bfloat16)
        self.rows = torch.arange(rows, device="cuda")
        self.position_ids = torch.arange(max_positions, device="cuda")
        self.heads = heads
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.scale = 1.0 / math.sqrt(head_dim)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, output: torch.Tensor, layer_id: int) -> None:
    context = get_forward_context()
    cache: DenseKVCache = context.attn_backend
    positions = context.forward_batch.positions
    batch = q.shape[0]
    rows = cache.rows[:batch]
    cache.k[layer_id].index_put_((rows, positions), k.view(batch, cache.kv_heads, cache.head_dim))
    cache.v[layer_id].index_put_((rows, positions), v.view(batch, cache.kv_heads, cache.head_dim))
    group = cache.heads // cache.kv_heads
    keys = cache.k[layer_id, :batch].float().repeat_interleave(group, dim=2)  # [B, S, H, D]
    values = cache.v[layer_id, :batch].float().repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,bshd->bhs", q.view(batch, cache.heads, cache.head_dim).float(), keys) * cache.scale
    beyond = cache.position_ids[None, :] > positions[:, None]  # [B, S]
    probs = scores.masked_fill(beyond[:, None, :], float("-inf")).softmax(dim=-1)
    result = torch.einsum("bhs,bshd->bhd", probs, values)
    output.copy_(result.reshape(batch, cache.heads * cache.head_dim))


def _attention_meta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, output: torch.Tensor, layer_id: int) -> None:
    return None


_LIBRARY.impl("attention", _attention, "CompositeExplicitAutograd")
_LIBRARY.impl("attention", _attention_meta, "Meta")
ATTENTION_OP = torch.ops.cudagraph_backend_gpu_test.attention
register_break_op(ATTENTION_OP)


class TinyLlama(torch.nn.Module):
    """Embedding, ``layers`` x (RMSNorm, GQA attention with rotary, RMSNorm, SwiGLU MLP), norm, LM head; bf16."""

    def __init__(
        self,
        *,
        vocab: int = 512,
        hidden: int = 256,
        layers: int = 4,
        heads: int = 8,
        kv_heads: int = 4,
        ffn: int = 512,
        max_positions: int = 64,
        max_rows: int = 64,
        seed: int = 0,
    ) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.head_dim = hidden // heads
        self.heads, self.kv_heads, self.layers = heads, kv_heads, layers

        def weight(*shape: int) -> torch.nn.Parameter:
            data = torch.randn(*shape, generator=generator) * (1.0 / math.sqrt(shape[-1]))
            return torch.nn.Parameter(data.to(device="cuda", dtype=torch.bfloat16), requires_grad=False)

        q_size, kv_size = heads * self.head_dim, kv_heads * self.head_dim
        self.q_size, self.kv_size = q_size, kv_size
        self.embed = weight(vocab, hidden)
        self.qkv = torch.nn.ParameterList([weight(q_size + 2 * kv_size, hidden) for _ in range(layers)])
        self.o = torch.nn.ParameterList([weight(hidden, q_size) for _ in range(layers)])
        self.gate_up = torch.nn.ParameterList([weight(2 * ffn, hidden) for _ in range(layers)])
        self.down = torch.nn.ParameterList([weight(hidden, ffn) for _ in range(layers)])
        self.lm_head = weight(vocab, hidden)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles.cos().to("cuda"), persistent=False)
        self.register_buffer("sin", angles.sin().to("cuda"), persistent=False)
        self.cache = DenseKVCache(layers, max_rows, max_positions, kv_heads, self.head_dim, heads)

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor, heads: int) -> torch.Tensor:
        x = x.reshape(x.shape[0], heads, self.head_dim).float()
        first, second = x.chunk(2, dim=-1)
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        rotated = torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)
        return rotated.to(torch.bfloat16).reshape(x.shape[0], heads * self.head_dim)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, vocab]`` of one decode step (one token per row)."""
        hidden = F.embedding(input_ids, self.embed)
        for layer in range(self.layers):
            x = F.rms_norm(hidden, (hidden.shape[-1],))
            q, k, v = F.linear(x, self.qkv[layer]).split((self.q_size, self.kv_size, self.kv_size), dim=-1)
            q, k = self._rotate(q, positions, self.heads), self._rotate(k, positions, self.kv_heads)
            attention_out = torch.empty_like(q)
            ATTENTION_OP(q, k, v.contiguous(), attention_out, layer)
            hidden = hidden + F.linear(attention_out, self.o[layer])
            x = F.rms_norm(hidden, (hidden.shape[-1],))
            gate, up = F.linear(x, self.gate_up[layer]).chunk(2, dim=-1)
            hidden = hidden + F.linear(F.silu(gate) * up, self.down[layer])
        return F.linear(F.rms_norm(hidden, (hidden.shape[-1],)), self.lm_head)


class DecodeHarness:
    """Static input buffers for the largest batch, a forward per shape, and an eager reference step."""

    def __init__(self, model: TinyLlama, max_batch: int) -> None:
        self.model = model
        self.static_input_ids = torch.zeros(max_batch, dtype=torch.long, device="cuda")
        self.static_positions = torch.zeros(max_batch, dtype=torch.long, device="cuda")
        self.contexts = {
            batch: ForwardContext(
                forward_batch=DecodeState(positions=self.static_positions[:batch]), attn_backend=model.cache
            )
            for batch in range(1, max_batch + 1)
        }
        self.generator = torch.Generator(device="cuda").manual_seed(7)

    def forward_fn(self, batch: int):
        """The closure a backend captures for ``batch`` rows: the model on the static buffers."""

        def forward() -> torch.Tensor:
            with torch.no_grad(), set_forward_context(self.contexts[batch]):
                return self.model(self.static_input_ids[:batch], self.static_positions[:batch])

        return forward

    def random_step(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh token ids and positions (past position 0, which warm-ups overwrite) for ``batch`` rows."""
        ids = torch.randint(0, 512, (batch,), device="cuda", generator=self.generator)
        positions = torch.randint(1, self.model.cos.shape[0], (batch,), device="cuda", generator=self.generator)
        return ids, positions

    def eager(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The reference: the same step run eagerly on its own tensors."""
        context = ForwardContext(forward_batch=DecodeState(positions=positions), attn_backend=self.model.cache)
        with torch.no_grad(), set_forward_context(context):
            return self.model(ids, positions).clone()

    def replay(self, backend, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Copy the step into the static buffers, replay its shape, and return a copy of the logits."""
        batch = ids.shape[0]
        self.static_input_ids[:batch].copy_(ids)
        self.static_positions[:batch].copy_(positions)
        with torch.no_grad(), backend.runtime_session(), set_forward_context(self.contexts[batch]):
            return backend.replay(batch).clone()
