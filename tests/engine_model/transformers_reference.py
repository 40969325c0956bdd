"""Hugging Face ``transformers`` as the reference of the model tests: its logits and greedy tokens for one prompt,
random weights in place of its init, and the one agreement check both comparison modules make (float32 on CPU).

Importing this module skips the importing test module where ``transformers`` is not installed."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch

from cudagraph.engine.model import CausalLM, reference_greedy, reference_logits
from cudagraph.engine.model.moe import EXPERT_COMPUTES_BY_NAME, SparseMoE

transformers = pytest.importorskip(
    "transformers", reason=("compares with transformers: pip install transformers (`nox -s tests` does)")
)

PROMPT = [11, 400, 3, 77, 250, 9, 9, 130, 61, 500, 2, 42]
GREEDY_STEPS = 8
FLOAT32_LOGITS = {"rtol": 1e-4, "atol": 1e-4}


def hf_logits(hf_model: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    """transformers' float32 logits for every position of ``token_ids``."""
    with torch.no_grad():
        return hf_model(torch.tensor([token_ids]), use_cache=False).logits[0].float()


def hf_greedy(hf_model: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    """transformers' greedy tokens after ``prompt`` (no KV cache: the whole sequence every step)."""
    sequence = list(prompt)
    for _ in range(steps):
        sequence.append(int(hf_logits(hf_model, sequence)[-1].argmax()))
    return sequence[len(prompt) :]


def perturb_weights(hf_model: torch.nn.Module, seed: int) -> None:
    """Replace transformers' init (norms at one, biases at zero) with random values, so that a norm or bias
    mapped to the wrong place changes the output."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in hf_model.named_parameters():
            if "norm" in name:
                parameter.copy_(1 + 0.1 * torch.randn(parameter.shape, generator=generator))
            elif name.endswith("bias"):
                parameter.copy_(0.1 * torch.randn(parameter.shape, generator=generator))
            else:
                std = 1 / math.sqrt(parameter.shape[-1])
                parameter.copy_(std * torch.randn(parameter.shape, generator=generator))


def use_expert_compute(model: torch.nn.Module, name: str) -> None:
    """Every sparse block of ``model`` computes its experts with ``name`` (``dense``, ``grouped_mm``, ...)."""
    for module in model.modules():
        if isinstance(module, SparseMoE):
            module.expert_compute = EXPERT_COMPUTES_BY_NAME[name]


def assert_agrees_with_transformers(
    model: CausalLM, hf_model: torch.nn.Module, expert_computes: Sequence[str] = ()
) -> None:
    """Our logits of ``PROMPT`` are transformers' within float32 rounding (under each of ``expert_computes`` in
    turn, where given), and our greedy tokens are its tokens."""
    expected = hf_logits(hf_model, PROMPT)
    for compute in expert_computes or (None,):
        if compute is not None:
            use_expert_compute(model, compute)
        torch.testing.assert_close(reference_logits(model, PROMPT), expected, **FLOAT32_LOGITS)
    assert reference_greedy(model, PROMPT, GREEDY_STEPS) == hf_greedy(hf_model, PROMPT, GREEDY_STEPS)
