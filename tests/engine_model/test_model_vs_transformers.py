"""Our forward against the Hugging Face ``transformers`` forward on tiny random models, float32 on CPU, both ways:
our checkpoints loaded by transformers, and transformers checkpoints loaded by us."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers_reference import assert_agrees_with_transformers, perturb_weights, transformers

from cudagraph.engine.model import (
    ModelConfig,
    RopeScaling,
    load_model,
    model_config_from_preset,
    random_model,
    save_model,
)

OUR_CONFIGS = {
    "qwen3": model_config_from_preset("tiny-qwen3-random"),
    "qwen3-bias": model_config_from_preset("tiny-qwen3-random").with_overrides(attention_bias=True),
    "llama": model_config_from_preset("tiny-llama-random"),
    "llama-bias": model_config_from_preset("tiny-llama-random").with_overrides(attention_bias=True),
    "llama3-rope": model_config_from_preset("tiny-llama-random").with_overrides(
        rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 64), max_position_embeddings=512
    ),
    "linear-rope": model_config_from_preset("tiny-llama-random").with_overrides(
        rope_scaling=RopeScaling("linear", 4.0)
    ),
    "qwen2": model_config_from_preset("tiny-llama-random").with_overrides(model_type="qwen2", num_kv_heads=2),
}


@pytest.mark.parametrize("name", list(OUR_CONFIGS))
def test_transformers_loads_our_checkpoint_and_agrees(tmp_path: Path, name: str) -> None:
    model = random_model(OUR_CONFIGS[name], seed=7)
    save_model(model, tmp_path)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert type(hf_model).__name__ == model.config.architecture
    assert_agrees_with_transformers(model, hf_model)


HF_CONFIGS = {
    "qwen3": lambda: transformers.Qwen3Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        intermediate_size=96, vocab_size=512, tie_word_embeddings=True, max_position_embeddings=256,
    ),
    "llama": lambda: transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
        intermediate_size=96, vocab_size=512, tie_word_embeddings=False, max_position_embeddings=256,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64},
    ),
    "qwen2": lambda: transformers.Qwen2Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        intermediate_size=96, vocab_size=512, tie_word_embeddings=False, max_position_embeddings=256,
    ),
}  # fmt: skip


@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
@pytest.mark.parametrize("name", list(HF_CONFIGS))
def test_we_load_a_transformers_checkpoint_and_agree(tmp_path: Path, name: str, sharded: bool) -> None:
    torch.manual_seed(0)
    hf_model = transformers.AutoModelForCausalLM.from_config(HF_CONFIGS[name]()).eval()
    perturb_weights(hf_model, seed=1)
    hf_model.save_pretrained(tmp_path, max_shard_size="50KB" if sharded else "5GB")
    assert (tmp_path / "model.safetensors.index.json").exists() == sharded
    model = load_model(tmp_path)
    assert model.config == ModelConfig.from_pretrained(tmp_path) and model.config.model_type == name
    assert model.dtype == torch.float32
    assert_agrees_with_transformers(model, hf_model)
