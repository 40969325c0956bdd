"""The batched LoRA delta: ``add_delta``, what ``LayerAdapters`` calls, takes the layer's kernel set's fused delta
where the set has one (``LayerKernels.lora_delta``: the Triton set's two kernels) and ``add_lora_delta``, the plain
torch reference, elsewhere (the torch and FlashInfer sets, CPU).

Per token ``t`` with slot ``s = idx[t]``: ``delta[t] = scale[s] * (x[t] @ A_s^T) @ B_s^T``. It is computed for every
slot at once with fixed shapes: one matmul shrinks ``x`` by every slot's (and, for q/k/v, every target's) A, a
per-token row of ``scale_table`` keeps that token's slot's ranks scaled and zeroes the rest, and one matmul expands
by every target's and slot's B straight into the projection's output rows. No gather of per-token factors, no
host sync, no shape that depends on the indices: what a CUDA graph needs, on CPU and GPU alike. The extra work is
``slots * max_rank`` columns per matmul, small beside the projection itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .slots import ProjectionSlots

if TYPE_CHECKING:
    from ..kernels import LayerKernels


def add_lora_delta(out: torch.Tensor, x: torch.Tensor, projection: ProjectionSlots, scales: torch.Tensor) -> None:
    """Add every target's LoRA delta of ``x`` ``[T, in]`` to its rows of ``out`` ``[T, projection out]``, in place,
    each token through the slot its row of ``scales`` ``[T, slots * max_rank]`` selects (its row of the slots'
    ``scale_table``: that slot's scaling over its ranks, zeros elsewhere; ``LoraStep.gather_scales``)."""
    num_targets = len(projection.targets)
    shrunk = torch.mm(x, projection.a.flatten(0, 2).t())  # [T, targets * slots * max_rank]
    shrunk.unflatten(1, (num_targets, -1)).mul_(scales.unsqueeze(1))
    out[:, projection.row_start : projection.row_stop].addmm_(shrunk, projection.b.flatten(1).t())


def add_delta(
    kernels: LayerKernels, out: torch.Tensor, x: torch.Tensor, projection: ProjectionSlots, scales: torch.Tensor
) -> None:
    """``add_lora_delta``'s delta through ``kernels.lora_delta`` where the kernel set fuses it, else through
    ``add_lora_delta`` itself."""
    fused = kernels.lora_delta
    if fused is None:
        add_lora_delta(out, x, projection, scales)
    else:
        fused(out, x, projection.a, projection.b, scales, projection.rows)
