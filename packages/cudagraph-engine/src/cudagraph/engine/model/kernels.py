"""The decoder layer's fusable operations as one swappable set, and its plain-torch implementation (the reference).

A kernel set is everything a layer computes besides its matmuls and attention: RMSNorm (alone and fused with the
residual add), Qwen3's per-head q/k norm, rotary in place, and ``silu(gate) * up``. ``TorchKernels`` keeps the
reference numerics in plain torch and runs anywhere, including under ``torch.compile``; ``flashinfer_kernels``
runs the same operations as FlashInfer's fused CUDA kernels. ``kernel_backends`` chooses between them.

Every operation is capturable in a CUDA graph: no host syncs, no shape that depends on tensor values. The q/k head
norm and rotary write their result back into the fused q/k/v projection wherever they can (always, but for torch
kernels under ``torch.compile``: see ``out_views``), so keys and values stay side by side and the KV store is one
kernel.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F

from .config import ModelConfig
from .out_views import compute_into
from .rotary import apply_rotary, rotary_cos_sin_table


class RotaryStep(NamedTuple):
    """What ``rotate`` reads in one forward, built once for every layer by ``rotary_step``: the kernel set's
    rotary table (or its rows gathered at ``positions``, where the set gathers up front) and the positions."""

    cos_sin: torch.Tensor
    positions: torch.Tensor


class LayerKernels(Protocol):
    """The fusable operations of a decoder layer. Tensors are ``[T, ...]`` in the model dtype. ``add_rms_norm``,
    ``qk_rms_norm`` and ``rotate`` may write into the tensors they are given, so callers pass tensors they own
    (intermediates of the forward, never parameters or caller inputs) and go on with the returned ones."""

    name: str
    """The registry name (``kernel_backends.KERNEL_BACKENDS``)."""

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm of ``x`` ``[T, hidden]`` over its last dimension, scaled by ``weight`` ``[hidden]``."""
        ...

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rms_norm(x + residual), x + residual)``: the residual stream grows by ``x``, then is normed."""
        ...

    def qk_rms_norm(self, heads: torch.Tensor, weight: torch.Tensor, num_q_heads: int, eps: float) -> torch.Tensor:
        """Qwen3's head norms: ``heads`` ``[T, H, D]`` holds the q heads first, then the k heads (then v heads, left
        alone); ``weight`` ``[num_q_heads + num_k_heads, D]`` holds one row per normed head, the q norm's vector
        repeated for q heads and the k norm's for k heads. Returns the normed q and k heads ``[T, Hq + Hk, D]``,
        written into ``heads`` where the set can."""
        ...

    def rotary_table(self, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The table ``rotary_step`` reads, built once per model, for every position below
        ``max_position_embeddings`` (its layout is the kernel set's own)."""
        ...

    def rotary_step(self, table: torch.Tensor, positions: torch.Tensor) -> RotaryStep:
        """This forward's rotary input for the tokens at ``positions`` ``[T]`` (int64)."""
        ...

    def rotate(self, qk_heads: torch.Tensor, num_q_heads: int, rotary: RotaryStep) -> torch.Tensor:
        """The q and k heads ``qk_heads`` ``[T, Hq + Hk, D]`` (q first) rotated by their positions, written into
        ``qk_heads`` where the set can."""
        ...

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` for ``gate_up`` ``[T, 2 * I]`` holding gate then up; ``[T, I]``."""
        ...


class TorchKernels:
    """The reference kernel set in plain torch: runs on every device and dtype, and dynamo traces it.

    Numerics follow the Hugging Face implementation: the residual add rounds to the model dtype before the norm,
    norms reduce in float32, the head norm rounds before its scale, and ``silu(gate) * up`` rounds the activation
    first. Two fusions round once where the reference rounds twice (at most one ulp apart): the hidden-size norms
    apply their weight inside torch's fused RMSNorm kernel, and rotary adds its second product with ``addcmul``.
    """

    name = "torch"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """Normalize and scale in float32, round once to ``x``'s dtype."""
        return F.rms_norm(x, weight.shape, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Add ``x`` into ``residual`` in place (rounded, as the reference adds), then norm the sum."""
        residual.add_(x)
        return F.rms_norm(residual, weight.shape, weight, eps), residual

    def qk_rms_norm(self, heads: torch.Tensor, weight: torch.Tensor, num_q_heads: int, eps: float) -> torch.Tensor:
        """Norm every head of the contiguous projection (v's too, then dropped: cheaper than copying out the q/k
        slice), round, then scale the q and k heads by their rows of ``weight``, into ``heads`` when eager."""
        num_normed = weight.shape[0]
        normed = F.rms_norm(heads, heads.shape[-1:], eps=eps)
        return compute_into(heads[:, :num_normed], torch.mul, normed[:, :num_normed], weight)

    def rotary_table(self, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """``rotary.rotary_cos_sin_table``: ``cos`` then signed ``sin`` per position, in the model dtype."""
        return rotary_cos_sin_table(config, dtype, device)

    def rotary_step(self, table: torch.Tensor, positions: torch.Tensor) -> RotaryStep:
        """The table's rows at ``positions``, gathered once per forward rather than once per layer."""
        return RotaryStep(torch.index_select(table, 0, positions), positions)

    def rotate(self, qk_heads: torch.Tensor, num_q_heads: int, rotary: RotaryStep) -> torch.Tensor:
        """q and k heads together in three kernels (``rotary.apply_rotary``), into ``qk_heads`` when eager."""
        return apply_rotary(qk_heads, rotary.cos_sin, out=qk_heads)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``F.silu(gate) * up``, each rounded, as the reference computes it."""
        intermediate = gate_up.shape[-1] // 2
        return F.silu(gate_up[:, :intermediate]) * gate_up[:, intermediate:]


TORCH_KERNELS = TorchKernels()
"""The kernel set a model uses until ``CausalLM.use_kernels`` picks another."""
