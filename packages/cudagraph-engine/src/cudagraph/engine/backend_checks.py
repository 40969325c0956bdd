"""Every backend choice of a command, checked against the model's config and the device before anything is built.

A command reads ``config.json`` (no weights), resolves the CUDA-graph config, and asks here whether the attention
backend and the kernel set it names can run that model on that device, and whether its graphs and step kinds need
something of the attention backend it will get (prefill ``full`` captures attention; speculative decoding runs verify
steps). The first problem is one error, the one building would raise, before a weight is read or a tensor
allocated. ``auto`` choices never fail (they fall back); they are resolved here without logging, only to check what
the graphs need of them. Nothing here builds, allocates or logs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cudagraph.config import CudaGraphConfig

from .attention import AttentionTarget, attention_backend_class
from .kernels import KernelTarget, check_kernel_backend
from .model import ModelConfig, ShardPlan, resolve_dtype
from .model_runner import check_graphs_fit_attention, check_verify_fits_attention


@dataclass(frozen=True)
class BackendChoices:
    """What a command asked for: the attention backend and kernel set by name (or ``auto``), the ``--dtype``, the
    tensor-parallel size, and whether it speculates (runs verify steps)."""

    attention: str
    kernels: str
    dtype: str
    tp_size: int = 1
    speculates: bool = False


def check_backend_choices(
    choices: BackendChoices, model: ModelConfig, device: torch.device, config: CudaGraphConfig
) -> None:
    """Raise the error building the engine would raise for ``choices`` (``AttentionBackendError``,
    ``AttentionBackendUnavailableError``, ``KernelBackendError`` or ``ConfigError``), or return: the attention
    backend first, then the kernel set, then what the graphs and verify steps need of the attention backend."""
    dtype = resolve_dtype(choices.dtype, model)
    attention = attention_backend_class(choices.attention, AttentionTarget(device, dtype, model.head_dim))
    attention_name = str(getattr(attention, "name", choices.attention))
    # A rank computes at its own sizes (its heads and MLP width): the kernels are checked at rank 0's.
    local = ShardPlan(rank=0, size=choices.tp_size, group_name="tp").local_config(model)
    traced = config.model_forward_compiler is not None
    check_kernel_backend(choices.kernels, KernelTarget(local, dtype, device, traced=traced))
    check_graphs_fit_attention(config, attention, attention_name)
    if choices.speculates:
        check_verify_fits_attention(attention, attention_name)
