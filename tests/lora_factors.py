"""Random LoRA adapters for the tests of every directory (CPU, Triton interpreter, GPU): factors large enough to change
greedy tokens, drawn in one order (layer, then target) from the caller's generator, so a test that draws several
adapters from one generator gets the same factors it always did."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cudagraph.engine.lora import LORA_TARGETS, LoraAdapter
from cudagraph.engine.model import ModelConfig

TARGETS = tuple(LORA_TARGETS)
"""Every projection the engine's adapters may target (q/k/v/o)."""


def random_lora_adapter(
    config: ModelConfig,
    rank: int,
    generator: torch.Generator,
    *,
    num_layers: int | None = None,
    targets: Sequence[str] = TARGETS,
    device: str | torch.device = "cpu",
    alpha: float | None = None,
) -> LoraAdapter:
    """Factors of ``rank`` (``* 0.3``) for ``targets`` of the first ``num_layers`` layers of ``config`` (all where
    ``None``), on ``device``; ``alpha`` defaults to ``2 * rank`` (a scaling of 2)."""
    factors = {}
    for layer in range(config.num_layers if num_layers is None else num_layers):
        for name in targets:
            target = LORA_TARGETS[name]
            a = torch.randn((rank, target.in_features(config)), generator=generator) * 0.3
            b = torch.randn((target.out_features(config), rank), generator=generator) * 0.3
            factors[(layer, name)] = (a.to(device), b.to(device))
    return LoraAdapter.from_tensors(factors, alpha=2.0 * rank if alpha is None else alpha)
