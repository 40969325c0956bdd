"""The decoder layer's kernel set on FlashInfer's fused CUDA kernels (needs the optional ``flashinfer-python``).

One kernel per operation: residual add + RMSNorm (``fused_add_rmsnorm``, in place), RMSNorm, the q and k head norms
(``rmsnorm`` over ``[T, heads, D]`` views, in place; one launch per projection, because Qwen3's q and k norms have
different weights and the kernel takes one vector), rotary of q and k together in place from the positions
(``apply_rope_with_cos_sin_cache_inplace`` over a float32 cos/sin table), and ``silu_and_mul``. All of them write
into the projection they are given, so keys and values stay side by side for the KV store.

Numerics: every kernel computes in float32 and rounds once, where the torch reference rounds between steps (the
residual sum before its norm, the normed heads before their scale, silu before the product, cos/sin to the model
dtype); results agree within bfloat16 rounding. What it runs on (float16 or bfloat16 on CUDA, the head sizes its
rotary kernel is built for) is checked before this module is imported: ``registry.FLASHINFER_REQUIREMENTS``.

FlashInfer 0.5.3 does not register these functions as torch custom ops (its ``register_custom_op`` returns the
function unchanged), so dynamo cannot trace them: a forward that ``torch.compile`` traces (``tc_piecewise``) uses
the torch kernel set (``registry.select_kernels`` decides).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import flashinfer.activation
import flashinfer.norm
import flashinfer.rope
import torch

from ..layer_set import ComposedKernels, RotaryStep
from ..rotary import rotary_cos_sin_halves_table

if TYPE_CHECKING:
    from ...model.architecture import ModelConfig


class FlashInferKernels(ComposedKernels):
    """``LayerKernels`` on FlashInfer: one fused kernel per operation (two for Qwen3's q and k head norms); the
    projections are cuBLAS matmuls."""

    name = "flashinfer"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """``flashinfer.norm.rmsnorm`` into a new tensor."""
        return flashinfer.norm.rmsnorm(x, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``residual += x`` and ``x = norm(residual)`` in one kernel (the norm reads the float32 sum)."""
        flashinfer.norm.fused_add_rmsnorm(x, residual, weight, eps)
        return x, residual

    def qk_rms_norm(self, heads: torch.Tensor, weight: torch.Tensor, num_q_heads: int, eps: float) -> torch.Tensor:
        """The q heads by the q norm's vector (``weight[0]``), the k heads by the k norm's (``weight[num_q_heads]``),
        each in place in ``heads`` (each thread reads its elements before it writes them)."""
        qk = heads[:, : weight.shape[0]]
        q, k = qk[:, :num_q_heads], qk[:, num_q_heads:]
        flashinfer.norm.rmsnorm(q, weight[0], eps, out=q)
        flashinfer.norm.rmsnorm(k, weight[num_q_heads], eps, out=k)
        return qk

    def rotary_table(self, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """``rotary.rotary_cos_sin_halves_table``: float32 ``cos`` then ``sin`` halves per position."""
        return rotary_cos_sin_halves_table(config, device)

    def rotary_step(self, table: torch.Tensor, positions: torch.Tensor) -> RotaryStep:
        """Nothing to gather: the kernel reads the table at the positions itself."""
        return RotaryStep(table, positions)

    def rotate(self, qk_heads: torch.Tensor, num_q_heads: int, rotary: RotaryStep) -> torch.Tensor:
        """q and k rotated together in one kernel, in place (Neox layout: halves, not interleaved pairs)."""
        flashinfer.rope.apply_rope_with_cos_sin_cache_inplace(
            rotary.positions,
            qk_heads[:, :num_q_heads],
            qk_heads[:, num_q_heads:],
            qk_heads.shape[-1],
            rotary.cos_sin,
            is_neox=True,
        )
        return qk_heads

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``flashinfer.activation.silu_and_mul`` into a new tensor."""
        return flashinfer.activation.silu_and_mul(gate_up)


def warm_up(kernels: FlashInferKernels, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
    """Run every kernel once at the model's sizes on one token, so that FlashInfer builds and loads its modules
    (a first call compiles them, which takes seconds) before any step is timed or captured."""
    hidden = torch.ones((1, config.hidden_size), dtype=dtype, device=device)
    hidden_weight = torch.ones(config.hidden_size, dtype=dtype, device=device)
    kernels.add_rms_norm(kernels.rms_norm(hidden, hidden_weight, 1e-6), hidden.clone(), hidden_weight, 1e-6)
    num_heads = config.num_heads + 2 * config.num_kv_heads
    heads = torch.ones((1, num_heads, config.head_dim), dtype=dtype, device=device)
    head_weight = torch.ones((config.num_heads + config.num_kv_heads, config.head_dim), dtype=dtype, device=device)
    qk = kernels.qk_rms_norm(heads, head_weight, config.num_heads, 1e-6)
    table = kernels.rotary_table(config, dtype, device)
    kernels.rotate(qk, config.num_heads, kernels.rotary_step(table, torch.zeros(1, dtype=torch.int64, device=device)))
    kernels.silu_and_mul(torch.ones((1, 2 * config.intermediate_size), dtype=dtype, device=device))
    torch.cuda.synchronize(device)
