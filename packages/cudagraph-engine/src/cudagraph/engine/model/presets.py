"""Named model shapes for random-weight models: real architectures at benchmark size and tiny ones for CPU tests."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from .architecture import ModelConfig, RopeScaling
from .errors import ModelLoadError

PRESETS: Mapping[str, ModelConfig] = MappingProxyType(
    {
        # Qwen3-0.6B's shapes (bf16): the benchmark model.
        "qwen3-0.6b-random": ModelConfig(
            model_type="qwen3",
            hidden_size=1024,
            num_layers=28,
            num_heads=16,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=3072,
            vocab_size=151936,
            rms_norm_eps=1e-6,
            rope_theta=1_000_000.0,
            max_position_embeddings=40960,
            tie_word_embeddings=True,
            torch_dtype="bfloat16",
        ),
        # Llama-3-8B's shapes (bf16, rope scaling left out): the tensor-parallel benchmark model.
        "llama3-8b-random": ModelConfig(
            model_type="llama",
            hidden_size=4096,
            num_layers=32,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=14336,
            vocab_size=128256,
            rms_norm_eps=1e-5,
            rope_theta=500_000.0,
            max_position_embeddings=8192,
            tie_word_embeddings=False,
            torch_dtype="bfloat16",
        ),
        # Llama-3-70B's shapes (bf16, rope scaling left out): 80 layers, the tensor-parallel benchmark's large model.
        "llama3-70b-random": ModelConfig(
            model_type="llama",
            hidden_size=8192,
            num_layers=80,
            num_heads=64,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=28672,
            vocab_size=128256,
            rms_norm_eps=1e-5,
            rope_theta=500_000.0,
            max_position_embeddings=8192,
            tie_word_embeddings=False,
            torch_dtype="bfloat16",
        ),
        # Llama-3.2-1B's shapes (bf16, llama3 rope scaling): 16 layers, the benchmark's Llama model.
        "llama3.2-1b-random": ModelConfig(
            model_type="llama",
            hidden_size=2048,
            num_layers=16,
            num_heads=32,
            num_kv_heads=8,
            head_dim=64,
            intermediate_size=8192,
            vocab_size=128256,
            rms_norm_eps=1e-5,
            rope_theta=500_000.0,
            rope_scaling=RopeScaling("llama3", 32.0, 1.0, 4.0, 8192),
            max_position_embeddings=131072,
            tie_word_embeddings=True,
            torch_dtype="bfloat16",
        ),
        # Tiny float32 models: a CPU forward takes milliseconds.
        "tiny-qwen3-random": ModelConfig(
            model_type="qwen3",
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=32,
            intermediate_size=128,
            vocab_size=512,
            rope_theta=1_000_000.0,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            torch_dtype="float32",
        ),
        "tiny-llama-random": ModelConfig(
            model_type="llama",
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            num_kv_heads=1,
            head_dim=16,
            intermediate_size=160,
            vocab_size=512,
            rms_norm_eps=1e-5,
            rope_theta=500_000.0,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
            torch_dtype="float32",
        ),
    }
)
"""Preset name -> model config (weights come from ``random_model``)."""


def model_config_from_preset(name: str) -> ModelConfig:
    """The config of preset ``name``; an unknown name is an error listing the known ones."""
    if name not in PRESETS:
        raise ModelLoadError(f"unknown model preset {name!r}: known presets are {', '.join(sorted(PRESETS))}")
    return PRESETS[name]
