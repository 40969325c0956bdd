"""The model shapes the harness measures, engine presets with random bfloat16 weights: Qwen3-0.6B and Llama-3.2-1B
(16 layers, the "same 16-layer model" the breaks section uses), and Llama-3-8B, Llama-3-70B and Qwen3-32B for the
tensor-parallel section."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from cudagraph.engine.model import ModelConfig, model_config_from_preset

BENCH_PRESETS: Mapping[str, ModelConfig] = MappingProxyType(
    {
        "qwen3-0.6b": model_config_from_preset("qwen3-0.6b-random"),
        "llama-3.2-1b": model_config_from_preset("llama3.2-1b-random"),
        "llama-3-8b": model_config_from_preset("llama3-8b-random"),
        "llama-3-70b": model_config_from_preset("llama3-70b-random"),
        "qwen3-32b": model_config_from_preset("qwen3-32b-random"),
    }
)
"""Preset name -> model config, in table order."""

BREAKS_PRESET = "llama-3.2-1b"
"""The 16-layer model the breaks section breaks at every attention op."""


def preset_config(name: str) -> ModelConfig:
    """The config of bench preset ``name``; an unknown name lists the known ones."""
    if name not in BENCH_PRESETS:
        raise ValueError(f"unknown bench preset {name!r}; choose from {', '.join(BENCH_PRESETS)}")
    return BENCH_PRESETS[name]
