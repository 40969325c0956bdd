"""The decoder layer's kernel set on Triton kernels (``ops``): the fewest launches a layer can make here.

Per decoder layer of a decode step: the q/k/v projection with the residual add and the RMSNorm before it computed
on its load, Qwen3's head norms and rotary of q and k with the KV store in one kernel (where the caller's ``attend``
says where the keys and values go), the output projection, the gate/up projection (with its add and norm fused the
same way), and the down projection with ``silu(gate) * up`` computed on its load: five launches besides attention
(FlashInfer's set makes nine, a KV store besides, and cuBLAS adds a split-K reduction to some of its projections).
Projections of steps wider than ``ops.GEMV_TILES`` cover stay cuBLAS matmuls, with the add + norm and the
activation as kernels of their own.

Triton ships with every CUDA build of torch; the set needs nothing else. Every operation goes through
``traced_ops``: eager steps launch through ``FastLauncher`` directly, and a forward that ``torch.compile`` traces
(``tc_piecewise``, compiled small buckets) calls the same operations as custom ops (``torch.ops.cudagraph_triton``),
which dynamo keeps as nodes of its graph and inductor compiles around.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..layer_set import KVDestination, QKHeads, RotaryStep
from ..rotary import rotary_cos_sin_halves_table
from . import lora, ops, traced_ops

if TYPE_CHECKING:
    from ...model.architecture import ModelConfig


class TritonKernels:
    """``LayerKernels`` on Triton: one kernel per fused operation."""

    name = "triton"
    fuses_kv_store = True

    # The plain functions themselves (no method of ours between the layer and the launch): eager steps launch
    # through FastLauncher, and dynamo traces each as its custom op (``traced_ops``).
    rms_norm = staticmethod(ops.rms_norm)
    """``ops.rms_norm``: into a new tensor."""
    add_rms_norm = staticmethod(ops.add_rms_norm)
    """``ops.add_rms_norm``: ``residual += x`` and ``x = norm(residual)`` in one kernel, both in place (traced: into
    new tensors)."""
    linear = staticmethod(traced_ops.linear)
    """``traced_ops.linear``: ``ops.gemv`` for the few rows of a decode step, a cuBLAS matmul for wider steps."""
    silu_mul_linear = staticmethod(traced_ops.silu_mul_linear)
    """``traced_ops.silu_mul_linear``: the activation computed on the down projection's load; for wide steps, its
    own kernel then cuBLAS."""
    add_norm_linear = staticmethod(traced_ops.add_norm_linear)
    """``traced_ops.add_norm_linear``: the residual add and the norm computed on the projection's load (the stream
    comes back as a new tensor); for wide steps, the fused add + norm kernel then cuBLAS."""

    lora_delta = staticmethod(lora.lora_delta)
    """``lora.lora_delta``: a LoRA delta in two launches (shrink with the scale fused, expand-add that reads only each
    target's B), in place in the projection (traced: the custom op ``cudagraph_triton::lora_delta``)."""

    def norm_and_rotate(self, heads: Tensor, q_and_k: QKHeads, rotary: RotaryStep) -> Tensor:
        """Head norms (when there is a weight) and rotary of the q and k heads in one kernel, in place."""
        return traced_ops.norm_rotate(heads, q_and_k, rotary, None)

    def norm_rotate_and_store(
        self, heads: Tensor, q_and_k: QKHeads, rotary: RotaryStep, kv_destination: KVDestination
    ) -> Tensor:
        """Head norms, rotary and the KV store in one kernel: the keys are written rotated, the values as they are."""
        return traced_ops.norm_rotate(heads, q_and_k, rotary, kv_destination)

    def rotary_table(self, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> Tensor:
        """``rotary.rotary_cos_sin_halves_table``: float32 ``cos`` then ``sin`` halves per position."""
        return rotary_cos_sin_halves_table(config, device)

    def rotary_step(self, table: Tensor, positions: Tensor) -> RotaryStep:
        """Nothing to gather: the kernel reads the table at the positions itself."""
        return RotaryStep(table, positions)


def warm_up(kernels: TritonKernels, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
    """Run every kernel at the model's sizes on one token, so that Triton compiles them (about a second each)
    before any step is timed or captured. Other step widths compile on their first (warm-up) run."""
    hidden = torch.ones((1, config.hidden_size), dtype=dtype, device=device)
    hidden_weight = torch.ones(config.hidden_size, dtype=dtype, device=device)
    normed, _ = kernels.add_rms_norm(kernels.rms_norm(hidden, hidden_weight, 1e-6), hidden.clone(), hidden_weight, 1e-6)
    qkv_weight = torch.zeros((config.q_size + 2 * config.kv_size, config.hidden_size), dtype=dtype, device=device)
    qkv_bias = torch.zeros(qkv_weight.shape[0], dtype=dtype, device=device) if config.qkv_bias else None
    heads = kernels.linear(normed, qkv_weight, qkv_bias).unflatten(-1, (-1, config.head_dim))
    head_weight = torch.ones((config.num_heads + config.num_kv_heads, config.head_dim), dtype=dtype, device=device)
    rotary = kernels.rotary_step(
        kernels.rotary_table(config, dtype, device), torch.zeros(1, dtype=torch.int64, device=device)
    )
    q_and_k = QKHeads(config.num_heads, config.num_kv_heads, head_weight if config.qk_norm else None, 1e-6)
    qk = kernels.norm_and_rotate(heads, q_and_k, rotary)
    kv_buffer = torch.zeros((1, 2, config.num_kv_heads, config.head_dim), dtype=dtype, device=device)
    slots = torch.zeros(1, dtype=torch.int64, device=device)
    kernels.norm_rotate_and_store(heads, q_and_k, rotary, (kv_buffer, slots))
    o_weight = torch.zeros((config.hidden_size, config.q_size), dtype=dtype, device=device)
    o_bias = torch.zeros(config.hidden_size, dtype=dtype, device=device) if config.o_bias else None
    kernels.linear(qk[:, : config.num_heads].flatten(1), o_weight, o_bias)
    gate_up_weight = torch.zeros((2 * config.intermediate_size, config.hidden_size), dtype=dtype, device=device)
    down_weight = torch.zeros((config.hidden_size, config.intermediate_size), dtype=dtype, device=device)
    gate_up, _ = kernels.add_norm_linear(normed, hidden.clone(), hidden_weight, 1e-6, gate_up_weight)
    kernels.silu_mul_linear(gate_up, down_weight)
    kernels.add_norm_linear(normed, hidden.clone(), hidden_weight, 1e-6, qkv_weight, qkv_bias)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
