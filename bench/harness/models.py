"""Random-weight models by preset, built once per run and shared by every section (their weights stay identical)."""

from __future__ import annotations

import torch

from cudagraph.engine.model import random_model

from .presets import preset_config


class ModelCache:
    """``get(preset)``: the preset's bf16 model on CUDA, built on first use."""

    def __init__(self) -> None:
        self._models: dict[str, torch.nn.Module] = {}

    def get(self, preset: str) -> torch.nn.Module:
        """The model of ``preset`` (seed 0)."""
        if preset not in self._models:
            self._models[preset] = random_model(preset_config(preset), seed=0, dtype="bfloat16", device="cuda")
        return self._models[preset]
