"""``random_model``: a ``CausalLM`` with seeded random weights at scales that keep activations and logits
well spread, for tests and benchmarks where no checkpoint exists.

Scales: projections with std ``1/sqrt(fan_in)`` so each layer keeps unit-scale activations; embeddings and head
std ``1/sqrt(hidden)`` so logits have unit spread whatever the width; norm weights ``N(1, 0.1)`` and biases
``N(0, 0.1)``, away from the trivial ones/zeros so that a misplaced norm or bias tensor changes the output.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .architecture import ModelConfig
from .causal_lm import CausalLM
from .checkpoint import checkpoint_slots
from .parallel import SINGLE_RANK, ShardPlan


@dataclass(frozen=True)
class InitRule:
    """Checkpoint tensors whose Hugging Face name ends with ``suffix`` are drawn from ``N(mean, std(shape))``."""

    suffix: str
    mean: float

    std: Callable[[tuple[int, ...]], float]


def _fan_in(shape: tuple[int, ...]) -> float:
    return 1.0 / math.sqrt(shape[-1])


INIT_RULES = (
    InitRule("norm.weight", 1.0, lambda _: 0.1),
    InitRule(".bias", 0.0, lambda _: 0.1),
    InitRule(".weight", 0.0, _fan_in),
)
"""First matching rule wins; every checkpoint tensor matches one (embeddings and head: ``1/sqrt(hidden)``)."""


def random_model(
    config: ModelConfig,
    seed: int = 0,
    dtype: torch.dtype | str = "auto",
    device: torch.device | str = "cpu",
    shard: ShardPlan = SINGLE_RANK,
) -> CausalLM:
    """A ``CausalLM`` of ``config`` with random weights drawn from ``seed`` on ``device`` (float32 draws, rounded
    to ``dtype``; the same seed and device give the same weights).

    Weights are drawn per checkpoint tensor, so the model is exactly what ``save_model`` can write (Qwen3's q/k
    norm weight is one vector shared by all heads, as in the checkpoint format). With a ``shard`` of several
    ranks every whole tensor is drawn and the rank keeps its part, so the ranks together hold exactly the
    single-rank model of the same seed (a rank skips, after drawing them, the experts other ranks hold).
    """
    model = CausalLM(config, dtype, device, shard)
    generator = torch.Generator(device=model.device).manual_seed(seed)
    held = {slot.hf_name: slot for slot in checkpoint_slots(config, shard)}
    with torch.no_grad():
        # Every tensor of the whole model is drawn, in one order, so each rank's draws are the single-rank model's.
        for whole in checkpoint_slots(config):
            rule = next(rule for rule in INIT_RULES if whole.hf_name.endswith(rule.suffix))
            draw = torch.empty(whole.shape, dtype=torch.float32, device=model.device)
            draw.normal_(rule.mean, rule.std(whole.shape), generator=generator)
            slot = held.get(whole.hf_name)
            if slot is None:  # an expert another rank holds
                continue
            target = slot.target(model)
            part = slot.select(draw)
            target.copy_(part.expand_as(target) if slot.broadcast else part)
    return model
