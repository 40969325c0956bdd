"""The decoder's building blocks in plain torch, in a fused layout: one q/k/v matmul, one gate/up matmul, q and k
normed and rotated together, few kernels per layer (a batch-1 decode step is bound by kernel count, not FLOPs).

Numerics stay close to the reference implementation: norms reduce in float32, ``silu(gate) * up`` as it does.
Three fusions round once where it rounds twice (at most one bf16 ulp apart): the hidden-size norms apply their
weight inside torch's fused RMSNorm kernel, rotary adds its second product with ``addcmul``, and the output and
down projections accumulate into the residual stream inside the matmul (``addmm_``, in place). Nothing here syncs
with the host or makes a shape depend on data: a forward is capturable in a CUDA graph.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .collectives import all_reduced
from .config import ModelConfig
from .rotary import apply_rotary


class AttendFn(Protocol):
    """Attention supplied by the caller: ``attend(layer_id, q, k, v) -> out``.

    ``q`` is ``[T, num_heads * head_dim]``, ``k`` and ``v`` ``[T, num_kv_heads * head_dim]``, with rotary (and
    Qwen3's q/k norms) already applied; the result is ``[T, num_heads * head_dim]`` in the activation dtype.
    All three are column slices of fused tensors: the last dimension is contiguous but, for ``T > 1``, the row
    stride is larger than the width, so an implementation must not assume they are contiguous (``reshape`` or
    ``copy_`` them, never ``view`` across rows). Scale scores by ``config.attention_scale``.
    """

    def __call__(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attend ``q`` to ``k``/``v`` for layer ``layer_id``."""
        ...


def _parameter(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension, then a learned per-channel scale, in one fused kernel."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _parameter((size,), dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize and scale in float32, round once to ``x``'s dtype."""
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class HeadRMSNorm(nn.Module):
    """Qwen3's per-head RMSNorm of q and k, as one norm over a ``[T, heads, head_dim]`` tensor whose first
    ``num_heads`` heads are q (scaled by ``q_norm``'s weight) and the next ``num_kv_heads`` are k (``k_norm``'s);
    rows of ``weight`` hold one copy per head, so the scale is one broadcast product."""

    def __init__(self, num_heads: int, head_dim: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _parameter((num_heads, head_dim), dtype, device)

    def forward(self, heads: torch.Tensor) -> torch.Tensor:
        """Norm every head of ``heads`` (which may hold more heads than ``weight``: they are normed, then dropped),
        round to the activation dtype, then scale (the reference rounding order)."""
        normed = F.rms_norm(heads, heads.shape[-1:], eps=self.eps)
        return normed[:, : self.weight.shape[0]] * self.weight


class Attention(nn.Module):
    """Grouped-query self-attention around a caller-supplied ``attend``: fused q/k/v projection (with Qwen2's
    bias), Qwen3's per-head q/k norms, rotary, and the output projection (row-parallel, all-reduced over
    ``reduce_group`` when the model is sharded)."""

    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        dtype: torch.dtype,
        device: torch.device,
        reduce_group: str | None = None,
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.reduce_group = reduce_group
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.q_size
        self.kv_size = config.kv_size
        qkv_size = config.q_size + 2 * config.kv_size
        self.qkv_weight = _parameter((qkv_size, config.hidden_size), dtype, device)
        self.qkv_bias = _parameter((qkv_size,), dtype, device) if config.qkv_bias else None
        self.o_weight = _parameter((config.hidden_size, config.q_size), dtype, device)
        self.o_bias = _parameter((config.hidden_size,), dtype, device) if config.o_bias else None
        self.qk_norm = (
            HeadRMSNorm(config.num_heads + config.num_kv_heads, config.head_dim, config.rms_norm_eps, dtype, device)
            if config.qk_norm
            else None
        )

    def forward(self, x: torch.Tensor, cos_sin: torch.Tensor, attend: AttendFn, residual: torch.Tensor) -> torch.Tensor:
        """``residual + attention(x)`` for ``x`` and ``residual`` ``[T, hidden]`` and the gathered rotary rows
        ``cos_sin`` ``[T, 2 * head_dim]``; the sum is accumulated into ``residual`` in place and returned."""
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)
        qk_width = self.q_size + self.kv_size
        if self.qk_norm is not None:
            # Norm the whole contiguous projection (v's heads too, then dropped): cheaper than copying a q/k slice.
            qk = self.qk_norm(qkv.unflatten(-1, (-1, self.head_dim)))
        else:
            qk = qkv[:, :qk_width].unflatten(-1, (self.num_heads + self.num_kv_heads, self.head_dim))
        qk = apply_rotary(qk, cos_sin).flatten(1)
        q, k = qk[:, : self.q_size], qk[:, self.q_size :]
        v = qkv[:, qk_width:]
        out = attend(self.layer_id, q, k, v)
        if self.reduce_group is not None:
            partial = all_reduced(F.linear(out, self.o_weight), self.reduce_group)
            return residual.add_(partial if self.o_bias is None else partial.add_(self.o_bias))
        if self.o_bias is not None:
            return residual.add_(F.linear(out, self.o_weight, self.o_bias))
        return residual.addmm_(out, self.o_weight.t())


class GatedMLP(nn.Module):
    """SwiGLU feed-forward: one fused gate/up matmul, ``silu(gate) * up``, then the down projection (row-parallel,
    all-reduced over ``reduce_group`` when the model is sharded)."""

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, reduce_group: str | None = None
    ) -> None:
        super().__init__()
        self.reduce_group = reduce_group
        self.intermediate_size = config.intermediate_size
        self.gate_up_weight = _parameter((2 * config.intermediate_size, config.hidden_size), dtype, device)
        self.down_weight = _parameter((config.hidden_size, config.intermediate_size), dtype, device)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + mlp(x)`` over ``[T, hidden]``, accumulated into ``residual`` in place and returned."""
        gate_up = F.linear(x, self.gate_up_weight)
        gate, up = gate_up[:, : self.intermediate_size], gate_up[:, self.intermediate_size :]
        if self.reduce_group is not None:
            return residual.add_(all_reduced(F.linear(F.silu(gate) * up, self.down_weight), self.reduce_group))
        return residual.addmm_(F.silu(gate) * up, self.down_weight.t())


class DecoderLayer(nn.Module):
    """Pre-norm residual block: ``h += attn(norm(h))``, then ``h += mlp(norm(h))``, updating ``h`` in place.

    ``config`` holds one rank's heads and MLP width (``ShardPlan.local_config``); ``reduce_group`` names the
    process group whose all-reduce completes the row-parallel projections (``None``: one rank, no collective)."""

    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        dtype: torch.dtype,
        device: torch.device,
        reduce_group: str | None = None,
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.self_attn = Attention(config, layer_id, dtype, device, reduce_group)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.mlp = GatedMLP(config, dtype, device, reduce_group)

    def forward(self, hidden: torch.Tensor, cos_sin: torch.Tensor, attend: AttendFn) -> torch.Tensor:
        """One block over the residual stream ``hidden`` ``[T, hidden]``, which it updates in place and returns
        (the caller must own it: ``CausalLM.forward`` passes its own embedding output)."""
        hidden = self.self_attn(self.input_layernorm(hidden), cos_sin, attend, residual=hidden)
        return self.mlp(self.post_attention_layernorm(hidden), residual=hidden)
