"""Named model shapes for random-weight models: real architectures at benchmark size and tiny ones for CPU tests.

The presets are a table of differences: each row names a family base (what every preset of that family shares), the
row's shape, and whatever else the row changes. A value set in a row wins over the base's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .architecture import ModelConfig, RopeScaling
from .errors import ModelLoadError


@dataclass(frozen=True)
class _FamilyBase:
    """The fields every preset of one family shares (bf16 at the real model's vocabulary and context)."""

    model_type: str
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    torch_dtype: str = "bfloat16"


_SHAPE_FIELDS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size")
"""The columns of a row's shape, in order."""


@dataclass(frozen=True)
class _Preset:
    """One row of the table: a family base, a shape, and the fields this row sets differently from the base."""

    name: str
    base: _FamilyBase
    shape: tuple[int, int, int, int, int, int]
    """The layer sizes, one per ``_SHAPE_FIELDS`` column."""
    changes: Mapping[str, Any] = field(default_factory=dict)

    def config(self) -> ModelConfig:
        """The validated model config this row stands for."""
        fields = {**vars(self.base), **dict(zip(_SHAPE_FIELDS, self.shape, strict=True)), **self.changes}
        return ModelConfig(**fields)


_QWEN3 = _FamilyBase("qwen3", 151936, 1e-6, 1_000_000.0, max_position_embeddings=40960, tie_word_embeddings=True)
_LLAMA3 = _FamilyBase("llama", 128256, 1e-5, 500_000.0, max_position_embeddings=8192, tie_word_embeddings=False)
_MIXTRAL = _FamilyBase("mixtral", 32000, 1e-5, 1_000_000.0, max_position_embeddings=32768, tie_word_embeddings=False)
_QWEN3_MOE = _FamilyBase(
    "qwen3_moe", 151936, 1e-6, 1_000_000.0, max_position_embeddings=40960, tie_word_embeddings=False
)

_TINY: Mapping[str, Any] = MappingProxyType(
    {"vocab_size": 512, "max_position_embeddings": 4096, "torch_dtype": "float32"}
)
"""What the tiny float32 presets change from their family: a CPU forward takes milliseconds."""

_LLAMA3_2_ROPE = RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)


def _experts(count: int, per_token: int, width: int) -> dict[str, Any]:
    """The expert fields of a Qwen3-MoE row: ``count`` experts of SwiGLU width ``width``, ``per_token`` of them per
    token, routing weights renormalized, every layer sparse (as in the released Qwen3-MoE models)."""
    return {
        "num_experts": count,
        "num_experts_per_tok": per_token,
        "moe_intermediate_size": width,
        "norm_topk_prob": True,
    }


_TABLE = (
    # Shape columns: hidden size, layers, heads, key/value heads, head dim, MLP intermediate size.
    # Qwen3-0.6B's shapes (bf16): the benchmark model.
    _Preset("qwen3-0.6b-random", _QWEN3, (1024, 28, 16, 8, 128, 3072)),
    # Llama-3-8B's shapes (bf16, rope scaling left out): the tensor-parallel benchmark model.
    _Preset("llama3-8b-random", _LLAMA3, (4096, 32, 32, 8, 128, 14336)),
    # Llama-3-70B's shapes (bf16, rope scaling left out): 80 layers, the tensor-parallel benchmark's large model.
    _Preset("llama3-70b-random", _LLAMA3, (8192, 80, 64, 8, 128, 28672)),
    # Qwen3-32B's shapes (bf16, untied embeddings): 64 layers, the tensor-parallel benchmark's TP=8 Qwen model.
    _Preset("qwen3-32b-random", _QWEN3, (5120, 64, 64, 8, 128, 25600), {"tie_word_embeddings": False}),
    # Llama-3.2-1B's shapes (bf16, llama3 rope scaling): 16 layers, the benchmark's Llama model.
    _Preset(
        "llama3.2-1b-random",
        _LLAMA3,
        (2048, 16, 32, 8, 64, 8192),
        {"rope_scaling": _LLAMA3_2_ROPE, "max_position_embeddings": 131072, "tie_word_embeddings": True},
    ),
    # Qwen3-30B-A3B's shapes (bf16): 48 layers of 128 experts, 8 per token; intermediate_size is its dense MLP
    # width, which no layer of it uses.
    _Preset("qwen3-30b-a3b-random", _QWEN3_MOE, (2048, 48, 32, 4, 128, 6144), _experts(128, 8, 768)),
    _Preset("tiny-qwen3-random", _QWEN3, (64, 2, 4, 2, 32, 128), _TINY),
    _Preset("tiny-qwen3-moe-random", _QWEN3_MOE, (64, 3, 4, 2, 32, 128), {**_TINY, **_experts(8, 2, 32)}),
    # Mixtral's experts are intermediate_size wide (it has no dense MLP).
    _Preset("tiny-mixtral-random", _MIXTRAL, (64, 2, 4, 2, 16, 48), {**_TINY, **_experts(4, 2, 48)}),
    _Preset("tiny-llama-random", _LLAMA3, (64, 2, 4, 1, 16, 160), _TINY),
)

PRESETS: Mapping[str, ModelConfig] = MappingProxyType({preset.name: preset.config() for preset in _TABLE})
"""Preset name -> model config (weights come from ``random_model``)."""


def model_config_from_preset(name: str) -> ModelConfig:
    """The config of preset ``name``; an unknown name is an error listing the known ones."""
    if name not in PRESETS:
        raise ModelLoadError(f"unknown model preset {name!r}: known presets are {', '.join(sorted(PRESETS))}")
    return PRESETS[name]
