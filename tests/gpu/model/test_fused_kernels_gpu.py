"""The fused kernel sets (FlashInfer's, Triton's) against the torch kernel set on random Qwen3- and Llama-shaped
bfloat16 models: the same logits within bfloat16 rounding, no less accurate against a float32 run of the same
weights, and the same greedy tokens over 32 steps of several prompts (prompts of 1 to 8 tokens run Triton's decode
projections, longer ones its cuBLAS fallback)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from cudagraph.engine.kernels import KernelTarget, select_kernels
from cudagraph.engine.model import (
    CausalLM,
    ModelConfig,
    RopeScaling,
    model_config_from_preset,
    random_model,
    reference_logits,
)

pytestmark = pytest.mark.gpu

FUSED_SETS = [
    pytest.param(
        "flashinfer",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("flashinfer") is None,
            reason=(
                "flashinfer is not installed: pip install flashinfer-python into the GPU interpreter (or "
                "put its wheels in .whl/, which `nox -s gpu` unpacks)"
            ),
        ),
    ),
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("triton") is None,
            reason=("triton is not installed: pip install triton (CUDA builds of torch bring it)"),
        ),
    ),
]

MODELS = {
    # Qwen3-0.6B's layer shapes (head_dim 128, q/k norms), fewer layers and a smaller vocabulary.
    "qwen3": model_config_from_preset("qwen3-0.6b-random").with_overrides(
        num_layers=4, vocab_size=4096, max_position_embeddings=1024
    ),
    # Llama-shaped with head_dim 64 and llama3 rotary scaling.
    "llama": model_config_from_preset("tiny-llama-random").with_overrides(
        hidden_size=512,
        num_layers=4,
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        intermediate_size=1024,
        vocab_size=4096,
        max_position_embeddings=1024,
        rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 128),
        torch_dtype="bfloat16",
    ),
}
PROMPTS = (
    [7, 1021, 33, 480, 2900, 15, 15, 611, 3999, 204, 87, 1500],
    [1, 2, 3],
    [5],
    [9, 3070, 8, 7, 640, 5, 4, 3],
    [4000, 12, 800, 800, 800, 9, 2048, 77, 5, 3100, 64, 1, 999, 18, 250, 3333, 41, 7, 2],
)
GREEDY_STEPS = 32

FUSED_LOGITS_RELATIVE = 0.05
"""The fused logits lie within this fraction of the largest torch-kernel logit: two implementations that round
differently in bfloat16 (as the torch path does against transformers, which the model GPU tests hold to the same
bound); a wiring mistake (a wrong weight row, head or rotary angle) moves logits by the whole scale."""
NEAR_TIE_SHARE = 0.1
"""At most this share of greedy steps may pick a different token on a near tie (see the greedy test)."""

FUSED_ACCURACY_RATIO = 1.25
"""Against float32 on the same weights, the fused kernels' mean logit error is at most this multiple of the torch
kernels' (they round once where the torch path rounds between steps, so they should not be worse)."""


def bf16_model(config: ModelConfig, kernels: str) -> CausalLM:
    model = random_model(config, seed=1, dtype="bfloat16", device="cuda")
    model.use_kernels(select_kernels(kernels, KernelTarget(config, torch.bfloat16, torch.device("cuda"))))
    assert model.kernels.name == kernels
    return model


def float32_copy(model: CausalLM) -> CausalLM:
    """The same (bfloat16-valued) weights computing in float32 with the torch kernels."""
    exact = CausalLM(model.config, dtype=torch.float32, device="cuda")
    with torch.no_grad():
        for parameter, source in zip(exact.parameters(), model.parameters(), strict=True):
            parameter.copy_(source.float())
    return exact


@pytest.mark.parametrize("kernels", FUSED_SETS)
@pytest.mark.parametrize("name", list(MODELS))
def test_fused_logits_match_the_torch_kernels_and_are_no_less_accurate(name: str, kernels: str) -> None:
    torch_model, fused_model = bf16_model(MODELS[name], "torch"), bf16_model(MODELS[name], kernels)
    exact_model = float32_copy(torch_model)
    for prompt in PROMPTS:
        expected, fused = reference_logits(torch_model, prompt), reference_logits(fused_model, prompt)
        exact = reference_logits(exact_model, prompt)
        scale = expected.abs().max().item()
        error = (fused - expected).abs().max().item()
        torch_error, fused_error = (expected - exact).abs().mean().item(), (fused - exact).abs().mean().item()
        print(
            f"\n{name} on {kernels}, prompt of {len(prompt)}: max |fused - torch| {error:.4f} "
            f"({error / scale:.2%} of the largest logit); mean error against float32: torch kernels "
            f"{torch_error:.5f}, fused {fused_error:.5f}"
        )
        assert error <= FUSED_LOGITS_RELATIVE * scale
        assert fused_error <= FUSED_ACCURACY_RATIO * torch_error


@torch.inference_mode()
@pytest.mark.parametrize("kernels", FUSED_SETS)
@pytest.mark.parametrize("name", list(MODELS))
def test_fused_greedy_tokens_equal_the_torch_kernels_over_32_steps(name: str, kernels: str) -> None:
    """Follow the torch kernels' greedy path for 32 steps of every prompt; at each step the fused kernels pick the
    same token. A step whose torch top-2 margin is below twice the logit difference measured there is a near tie
    either rounding may break (a random-weight model's logits are flat, so its margins are often one bfloat16 step):
    such flips are printed and may be at most ``NEAR_TIE_SHARE`` of the steps; every other step must agree."""
    torch_model, fused_model = bf16_model(MODELS[name], "torch"), bf16_model(MODELS[name], kernels)
    disagreements, near_ties = [], []
    for index, prompt in enumerate(PROMPTS):
        sequence = list(prompt)
        for step in range(GREEDY_STEPS):
            expected, fused = reference_logits(torch_model, sequence)[-1], reference_logits(fused_model, sequence)[-1]
            top2 = expected.topk(2).values
            margin, error = (top2[0] - top2[1]).item(), (fused - expected).abs().max().item()
            token = int(expected.argmax())
            if int(fused.argmax()) != token:
                (near_ties if margin <= 2 * error else disagreements).append((index, step, round(margin, 4)))
            sequence.append(token)
    print(f"\n{name} on {kernels}: {GREEDY_STEPS} greedy steps x {len(PROMPTS)} prompts, near-tie flips {near_ties}")
    assert disagreements == [], f"(prompt, step, torch top-2 margin) where a clear choice differed: {disagreements}"
    assert len(near_ties) <= NEAR_TIE_SHARE * GREEDY_STEPS * len(PROMPTS), near_ties
