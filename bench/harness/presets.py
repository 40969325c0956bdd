"""The model shapes the harness measures: Qwen3-0.6B (the engine's preset) and Llama-3.2-1B (16 layers, the
"same 16-layer model" the breaks section uses), both with random bfloat16 weights."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from cudagraph.engine.model import ModelConfig, RopeScaling, model_config_from_preset

LLAMA_3_2_1B = ModelConfig(
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
)
"""Llama-3.2-1B's published shapes."""

BENCH_PRESETS: Mapping[str, ModelConfig] = MappingProxyType(
    {"qwen3-0.6b": model_config_from_preset("qwen3-0.6b-random"), "llama-3.2-1b": LLAMA_3_2_1B}
)
"""Preset name -> model config, in table order."""

BREAKS_PRESET = "llama-3.2-1b"
"""The 16-layer model the breaks section breaks at every attention op."""


def preset_config(name: str) -> ModelConfig:
    """The config of bench preset ``name``; an unknown name lists the known ones."""
    if name not in BENCH_PRESETS:
        raise ValueError(f"unknown bench preset {name!r}; choose from {', '.join(BENCH_PRESETS)}")
    return BENCH_PRESETS[name]
