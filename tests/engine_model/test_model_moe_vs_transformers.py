"""Qwen3-MoE against Hugging Face ``transformers``' ``Qwen3MoeForCausalLM`` on tiny random models, float32 on CPU,
both ways: our checkpoints loaded by transformers, and transformers checkpoints loaded by us. Both expert computations
(dense, grouped_mm: torch runs ``_grouped_mm`` on the CPU too) are held to the same logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers_reference import assert_agrees_with_transformers, perturb_weights, transformers

from cudagraph.engine.model import (
    ModelConfig,
    load_model,
    model_config_from_preset,
    random_model,
    save_model,
)
from cudagraph.engine.model.moe import SparseMoE

EXPERT_COMPUTES = ("dense", "grouped_mm")
"""Both CPU expert computations are held to transformers' logits."""

TINY_MOE = model_config_from_preset("tiny-qwen3-moe-random")
OUR_CONFIGS = {
    "all-sparse": TINY_MOE,
    # a dense layer among sparse ones, routing weights left at their softmax mass, Qwen3's bias switch on
    "mixed-unnormalized": TINY_MOE.with_overrides(mlp_only_layers=(1,), norm_topk_prob=False, attention_bias=True),
    "every-second-layer": TINY_MOE.with_overrides(decoder_sparse_step=2, num_experts_per_tok=3),
}


@pytest.mark.parametrize("name", list(OUR_CONFIGS))
def test_transformers_loads_our_moe_checkpoint_and_agrees(tmp_path: Path, name: str) -> None:
    config = OUR_CONFIGS[name]
    model = random_model(config, seed=7)
    assert [config.uses_experts(layer) for layer in range(config.num_layers)] == [
        isinstance(layer.mlp, SparseMoE) for layer in model.layers
    ]
    save_model(model, tmp_path)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert type(hf_model).__name__ == "Qwen3MoeForCausalLM"
    hf_sparse = [type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock" for layer in hf_model.model.layers]
    assert hf_sparse == [config.uses_experts(layer) for layer in range(config.num_layers)]
    assert_agrees_with_transformers(model, hf_model, EXPERT_COMPUTES)


def hf_moe_config(**changes: object) -> object:
    fields = {
        "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "intermediate_size": 96, "moe_intermediate_size": 48, "num_experts": 6,
        "num_experts_per_tok": 2, "norm_topk_prob": True, "vocab_size": 512, "max_position_embeddings": 256,
        "tie_word_embeddings": False, "mlp_only_layers": [2],
    }  # fmt: skip
    return transformers.Qwen3MoeConfig(**{**fields, **changes})


@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
def test_we_load_a_transformers_moe_checkpoint_and_agree(tmp_path: Path, sharded: bool) -> None:
    torch.manual_seed(0)
    hf_model = transformers.AutoModelForCausalLM.from_config(hf_moe_config()).eval()
    perturb_weights(hf_model, seed=1)
    hf_model.save_pretrained(tmp_path, max_shard_size="50KB" if sharded else "5GB")
    assert (tmp_path / "model.safetensors.index.json").exists() == sharded
    model = load_model(tmp_path)
    config = model.config
    assert config == ModelConfig.from_pretrained(tmp_path)
    assert (config.model_type, config.num_experts, config.moe_intermediate_size) == ("qwen3_moe", 6, 48)
    assert (config.num_experts_per_tok, config.norm_topk_prob, config.mlp_only_layers) == (2, True, (2,))
    assert_agrees_with_transformers(model, hf_model, EXPERT_COMPUTES)


def test_our_moe_checkpoint_round_trips_through_save_and_load(tmp_path: Path) -> None:
    model = random_model(OUR_CONFIGS["mixed-unnormalized"], seed=3)
    save_model(model, tmp_path, max_shard_bytes=64 * 1024)
    loaded = load_model(tmp_path)
    assert loaded.config == model.config
    for (name, mine), (other_name, theirs) in zip(model.named_parameters(), loaded.named_parameters(), strict=True):
        assert name == other_name and torch.equal(mine, theirs), name


# -- Mixtral: every layer sparse, Llama-style attention, its own tensor names -------------------------------------


def test_transformers_loads_our_mixtral_checkpoint_and_agrees(tmp_path: Path) -> None:
    model = random_model(model_config_from_preset("tiny-mixtral-random"), seed=5)
    save_model(model, tmp_path)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert type(hf_model).__name__ == "MixtralForCausalLM"
    assert_agrees_with_transformers(model, hf_model, EXPERT_COMPUTES)


def test_we_load_a_transformers_mixtral_checkpoint_and_agree(tmp_path: Path) -> None:
    torch.manual_seed(0)
    hf_config = transformers.MixtralConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=40, num_local_experts=6, num_experts_per_tok=3, vocab_size=512,
        max_position_embeddings=256, tie_word_embeddings=False,
    )  # fmt: skip
    hf_model = transformers.AutoModelForCausalLM.from_config(hf_config).eval()
    perturb_weights(hf_model, seed=1)
    hf_model.save_pretrained(tmp_path, max_shard_size="50KB")
    model = load_model(tmp_path)
    config = model.config
    assert (config.model_type, config.num_experts, config.num_experts_per_tok) == ("mixtral", 6, 3)
    assert config.moe_intermediate_size == config.intermediate_size == 40 and config.norm_topk_prob
    assert all(isinstance(layer.mlp, SparseMoE) for layer in model.layers)
    assert_agrees_with_transformers(model, hf_model)
