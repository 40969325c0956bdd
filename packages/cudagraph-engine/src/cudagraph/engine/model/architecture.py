"""The decoder's architecture, ``ModelConfig``: the shapes and switches of a Llama / Qwen2 / Qwen3 / Qwen3-MoE /
Mixtral decoder, read from a Hugging Face ``config.json`` and written back in the same format (not to be confused with
``cudagraph.config``, the CUDA-graph settings).

Pure data: never imports torch. Both the Transformers 4 spelling (``rope_theta`` + ``rope_scaling``, ``torch_dtype``)
and the Transformers 5 spelling (``rope_parameters``, ``dtype``) are read; both are written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .errors import ModelFileNotFoundError, ModelLoadError

CONFIG_FILE = "config.json"

SUPPORTED_DTYPES = ("float32", "bfloat16", "float16")
"""Checkpoint dtypes the model computes in (names as ``config.json`` spells them)."""


@dataclass(frozen=True)
class ExpertSpelling:
    """How one family with sparse experts spells them in ``config.json`` and in its checkpoint's tensor names."""

    count_keys: tuple[str, ...]
    """Keys of the number of experts, the first present wins (the first is written)."""
    width_key: str
    """Key of each expert's SwiGLU width (Mixtral: ``intermediate_size``, which it has no dense MLP for; its
    ``ModelConfig`` holds the width in ``moe_intermediate_size``, which is what is written)."""
    block: str
    """The sparse block's module name in the checkpoint (``model.layers.{i}.<block>.gate.weight`` is the router)."""
    gate: str
    up: str
    down: str
    """An expert's projection names (``<block>.experts.{e}.<gate>.weight``...)."""
    layer_pattern: bool
    """``decoder_sparse_step``, ``mlp_only_layers`` and ``norm_topk_prob`` are read (Qwen3-MoE); without, every
    layer is sparse and the top-k weights are always renormalized (Mixtral)."""


QWEN3_MOE_EXPERTS = ExpertSpelling(
    ("num_experts", "num_local_experts"), "moe_intermediate_size", "mlp", "gate_proj", "up_proj", "down_proj", True
)
MIXTRAL_EXPERTS = ExpertSpelling(
    ("num_local_experts",), "intermediate_size", "block_sparse_moe", "w1", "w3", "w2", False
)


@dataclass(frozen=True)
class ArchitectureFamily:
    """What one supported ``model_type`` implies beyond its ``config.json`` fields, and its defaults."""

    model_type: str
    architecture: str
    qkv_bias: bool | None
    """q/k/v projection bias fixed by the family (Qwen2: always), or ``None``: read ``attention_bias``."""
    qk_norm: bool
    """Per-head RMSNorm on q and k before rotary (Qwen3)."""
    default_max_position_embeddings: int
    experts: ExpertSpelling | None = None
    """How the family spells its sparse mixture-of-experts layers, or ``None``: it has none
    (``ModelConfig.uses_experts`` says which layers route)."""
    window_when_set: bool = False
    """Attention is windowed whenever ``sliding_window`` is set (Mixtral), rather than by ``use_sliding_window``."""

    @property
    def sparse_experts(self) -> bool:
        """Whether the family has sparse mixture-of-experts layers."""
        return self.experts is not None


FAMILIES: Mapping[str, ArchitectureFamily] = {
    family.model_type: family
    for family in (
        ArchitectureFamily("llama", "LlamaForCausalLM", None, qk_norm=False, default_max_position_embeddings=2048),
        ArchitectureFamily("qwen2", "Qwen2ForCausalLM", True, qk_norm=False, default_max_position_embeddings=32768),
        ArchitectureFamily("qwen3", "Qwen3ForCausalLM", None, qk_norm=True, default_max_position_embeddings=32768),
        ArchitectureFamily(
            "qwen3_moe",
            "Qwen3MoeForCausalLM",
            None,
            qk_norm=True,
            default_max_position_embeddings=32768,
            experts=QWEN3_MOE_EXPERTS,
        ),
        ArchitectureFamily(
            "mixtral",
            "MixtralForCausalLM",
            False,
            qk_norm=False,
            default_max_position_embeddings=131072,
            experts=MIXTRAL_EXPERTS,
            window_when_set=True,
        ),
    )
}
"""Supported families keyed by ``model_type``."""

_FAMILY_BY_ARCHITECTURE = {family.architecture: family for family in FAMILIES.values()}

ROPE_TYPES = ("default", "linear", "llama3")
"""Rotary scaling schemes implemented (``default``: none)."""

_ROPE_SCALING_FIELDS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


@dataclass(frozen=True)
class RopeScaling:
    """A rotary-frequency scaling scheme (``linear`` or ``llama3``) and its parameters."""

    rope_type: str
    factor: float
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``rope_scaling`` dict as ``config.json`` spells it."""
        fields = {name: getattr(self, name) for name in _ROPE_SCALING_FIELDS[self.rope_type]}
        return {"rope_type": self.rope_type, **fields}


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and switches of one decoder-only model of a supported family.

    Build it with ``ModelConfig.from_pretrained(directory)``, ``ModelConfig.from_hf_dict(config_dict)`` or from a
    preset (``model_config_from_preset``); every constructor validates the same way.
    """

    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    """Hugging Face's ``attention_bias`` switch (Llama, Qwen3: bias on q/k/v/o); Qwen2 always has q/k/v bias."""
    torch_dtype: str = "float32"
    """The checkpoint's dtype; what ``dtype="auto"`` computes in."""
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    num_experts: int = 0
    """Experts per sparse layer (0 in a family without experts)."""
    num_experts_per_tok: int = 0
    """Experts each token is routed to (top-k)."""
    moe_intermediate_size: int = 0
    """Each expert's SwiGLU width (``intermediate_size`` stays the width of the dense layers' MLP)."""
    norm_topk_prob: bool = False
    """Whether the top-k routing weights are renormalized to sum to 1 (else they keep their softmax mass)."""
    decoder_sparse_step: int = 1
    """Every ``decoder_sparse_step``-th layer (1-based) routes to experts, unless listed in ``mlp_only_layers``."""
    mlp_only_layers: tuple[int, ...] = ()
    """Layers (0-based) that keep a dense MLP in a family with experts."""

    def __post_init__(self) -> None:
        if self.model_type not in FAMILIES:
            raise ModelLoadError(
                f"unsupported model_type {self.model_type!r}: supported are {', '.join(sorted(FAMILIES))}"
            )
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size"):
            if getattr(self, name) <= 0:
                raise ModelLoadError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.vocab_size <= 0 or self.max_position_embeddings <= 0:
            raise ModelLoadError(
                f"vocab_size and max_position_embeddings must be positive, got {self.vocab_size} and "
                f"{self.max_position_embeddings}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads "
                f"({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ModelLoadError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.torch_dtype not in SUPPORTED_DTYPES:
            raise ModelLoadError(
                f"unsupported torch_dtype {self.torch_dtype!r}: supported are {', '.join(SUPPORTED_DTYPES)}"
            )
        self._check_experts()

    def _check_experts(self) -> None:
        """The expert fields: all unset in a family without experts, consistent in one with them."""
        if not FAMILIES[self.model_type].sparse_experts:
            if self.num_experts or self.num_experts_per_tok or self.moe_intermediate_size or self.mlp_only_layers:
                with_experts = ", ".join(name for name, family in FAMILIES.items() if family.sparse_experts)
                raise ModelLoadError(
                    f"model_type {self.model_type!r} has no experts: num_experts, num_experts_per_tok, "
                    f"moe_intermediate_size and mlp_only_layers are only for {with_experts}"
                )
            return
        if self.num_experts <= 0 or self.moe_intermediate_size <= 0:
            raise ModelLoadError(
                f"num_experts and moe_intermediate_size must be positive integers, got {self.num_experts} and "
                f"{self.moe_intermediate_size}"
            )
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ModelLoadError(
                f"num_experts_per_tok must be between 1 and num_experts ({self.num_experts}), got "
                f"{self.num_experts_per_tok}"
            )
        if self.decoder_sparse_step <= 0:
            raise ModelLoadError(f"decoder_sparse_step must be a positive integer, got {self.decoder_sparse_step}")
        outside = [layer for layer in self.mlp_only_layers if not 0 <= layer < self.num_layers]
        if outside:
            raise ModelLoadError(
                f"mlp_only_layers {list(self.mlp_only_layers)} names layers {outside} outside 0..{self.num_layers - 1}"
            )
        spelling = FAMILIES[self.model_type].experts
        fixed = (self.norm_topk_prob, self.decoder_sparse_step, self.mlp_only_layers) == (True, 1, ())
        if spelling is not None and not spelling.layer_pattern and not fixed:
            raise ModelLoadError(
                f"{self.model_type} routes on every layer with renormalized weights: norm_topk_prob must be true, "
                f"decoder_sparse_step 1 and mlp_only_layers empty, got {self.norm_topk_prob}, "
                f"{self.decoder_sparse_step} and {list(self.mlp_only_layers)}"
            )

    def uses_experts(self, layer_id: int) -> bool:
        """Whether layer ``layer_id`` (0-based) routes to sparse experts instead of running a dense MLP."""
        return (
            FAMILIES[self.model_type].sparse_experts
            and layer_id not in self.mlp_only_layers
            and (layer_id + 1) % self.decoder_sparse_step == 0
        )

    @property
    def has_experts(self) -> bool:
        """Whether any layer routes to sparse experts."""
        return any(self.uses_experts(layer_id) for layer_id in range(self.num_layers))

    @property
    def architecture(self) -> str:
        """The Hugging Face class name of this family (``architectures[0]`` in ``config.json``)."""
        return FAMILIES[self.model_type].architecture

    @property
    def qkv_bias(self) -> bool:
        """Whether the q/k/v projections carry a bias."""
        fixed = FAMILIES[self.model_type].qkv_bias
        return self.attention_bias if fixed is None else fixed

    @property
    def o_bias(self) -> bool:
        """Whether the output projection carries a bias."""
        return self.attention_bias and FAMILIES[self.model_type].qkv_bias is None

    @property
    def qk_norm(self) -> bool:
        """Whether q and k get a per-head RMSNorm before rotary (Qwen3)."""
        return FAMILIES[self.model_type].qk_norm

    @property
    def q_size(self) -> int:
        """Width of the query projection: ``num_heads * head_dim``."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of each of the key and value projections: ``num_kv_heads * head_dim``."""
        return self.num_kv_heads * self.head_dim

    @property
    def attention_scale(self) -> float:
        """Softmax scale of the attention scores: ``head_dim ** -0.5``."""
        return self.head_dim**-0.5

    def with_overrides(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Read ``config.json`` from a model directory (or the file itself: a ``.json`` file)."""
        config_path = Path(path)
        if config_path.is_dir():
            config_path = config_path / CONFIG_FILE
        elif config_path.is_file() and config_path.suffix != ".json":
            raise ModelLoadError(
                f"{config_path} is not a model directory: give a folder holding {CONFIG_FILE} plus model.safetensors "
                "or model.safetensors.index.json"
            )
        if not config_path.is_file():
            raise ModelFileNotFoundError(
                f"no {CONFIG_FILE} at {config_path}: a model directory needs config.json plus model.safetensors "
                "or model.safetensors.index.json"
            )
        try:
            raw = json.loads(config_path.read_text())
        except json.JSONDecodeError as error:
            raise ModelLoadError(f"{config_path} is not valid JSON: {error}") from None
        if not isinstance(raw, dict):
            raise ModelLoadError(f"{config_path} must hold a JSON object, got {type(raw).__name__}")
        return cls.from_hf_dict(raw, source=str(config_path))

    @classmethod
    def from_hf_dict(cls, raw: Mapping[str, Any], *, source: str = CONFIG_FILE) -> ModelConfig:
        """Parse a Hugging Face config dict; errors name ``source`` and the offending key."""
        family = _family_of(raw, source)
        reader = _FieldReader(raw, source)
        if reader.optional("hidden_act", str, "silu") != "silu":
            raise ModelLoadError(f"{source}: hidden_act {raw['hidden_act']!r} is not supported: only 'silu' is")
        if reader.optional("mlp_bias", bool, False):
            raise ModelLoadError(f"{source}: mlp_bias=true is not supported: only MLPs without bias are")
        if reader.optional("use_sliding_window", bool, False):
            raise ModelLoadError(f"{source}: use_sliding_window=true is not supported: only full attention is")
        if family.window_when_set and raw.get("sliding_window") is not None:
            raise ModelLoadError(
                f"{source}: sliding_window={raw['sliding_window']!r} is not supported: only full attention is "
                "(sliding_window null)"
            )
        hidden_size = reader.required("hidden_size", int)
        num_heads = reader.required("num_attention_heads", int)
        if raw.get("head_dim") is None and (num_heads <= 0 or hidden_size % num_heads):
            raise ModelLoadError(
                f"{source}: hidden_size ({hidden_size}) is not divisible by num_attention_heads ({num_heads}) and "
                "no head_dim is given"
            )
        rope_theta, rope_scaling = _read_rope(raw, source)
        experts = {} if family.experts is None else _read_experts(raw, reader, family.experts)
        return cls(
            model_type=family.model_type,
            hidden_size=hidden_size,
            num_layers=reader.required("num_hidden_layers", int),
            num_heads=num_heads,
            num_kv_heads=reader.optional("num_key_value_heads", int, num_heads),
            head_dim=reader.optional("head_dim", int, hidden_size // num_heads),
            intermediate_size=reader.required("intermediate_size", int),
            vocab_size=reader.required("vocab_size", int),
            rms_norm_eps=reader.optional("rms_norm_eps", float, 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=reader.optional(
                "max_position_embeddings", int, family.default_max_position_embeddings
            ),
            tie_word_embeddings=reader.optional("tie_word_embeddings", bool, False),
            attention_bias=reader.optional("attention_bias", bool, False),
            torch_dtype=_read_dtype(raw, source),
            bos_token_id=reader.optional("bos_token_id", int, None),
            eos_token_ids=_read_token_ids(raw.get("eos_token_id"), source),
            **experts,
        )

    def to_hf_dict(self, *, torch_dtype: str | None = None) -> dict[str, Any]:
        """This config as a ``config.json`` dict that Transformers 4 and 5 both load (``torch_dtype`` overrides
        the recorded dtype, e.g. when saving weights held in another dtype)."""
        dtype = torch_dtype or self.torch_dtype
        rope_parameters: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            rope_parameters.update(self.rope_scaling.to_hf_dict())
        config: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None if self.rope_scaling is None else self.rope_scaling.to_hf_dict(),
            "rope_parameters": rope_parameters,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": dtype,
            "dtype": dtype,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": _write_token_ids(self.eos_token_ids),
        }
        if FAMILIES[self.model_type].qkv_bias is None:
            config["attention_bias"] = self.attention_bias
        family = FAMILIES[self.model_type]
        if family.window_when_set:
            config["sliding_window"] = None
        spelling = family.experts
        if spelling is not None:
            config[spelling.count_keys[0]] = self.num_experts
            config[spelling.width_key] = self.moe_intermediate_size
            config["num_experts_per_tok"] = self.num_experts_per_tok
        if spelling is not None and spelling.layer_pattern:
            config.update(
                norm_topk_prob=self.norm_topk_prob,
                decoder_sparse_step=self.decoder_sparse_step,
                mlp_only_layers=list(self.mlp_only_layers),
            )
        return config


class _FieldReader:
    """Typed access to a raw config dict; a wrong type is one error naming the key and the expected type."""

    def __init__(self, raw: Mapping[str, Any], source: str) -> None:
        self.raw = raw
        self.source = source

    def required(self, key: str, kind: type) -> Any:
        if self.raw.get(key) is None:
            raise ModelLoadError(f"{self.source}: missing required key {key!r}")
        return self._typed(key, kind)

    def optional(self, key: str, kind: type, default: Any) -> Any:
        if self.raw.get(key) is None:
            return default
        return self._typed(key, kind)

    def _typed(self, key: str, kind: type) -> Any:
        value = self.raw[key]
        accepted = (int, float) if kind is float else kind
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, accepted):
            raise ModelLoadError(f"{self.source}: {key!r} must be {kind.__name__}, got {value!r}")
        return kind(value)


def _family_of(raw: Mapping[str, Any], source: str) -> ArchitectureFamily:
    model_type = raw.get("model_type")
    if isinstance(model_type, str) and model_type in FAMILIES:
        return FAMILIES[model_type]
    architectures = raw.get("architectures") or []
    for architecture in architectures:
        if architecture in _FAMILY_BY_ARCHITECTURE:
            return _FAMILY_BY_ARCHITECTURE[architecture]
    allowed = ", ".join(f"{family.model_type} ({family.architecture})" for family in FAMILIES.values())
    raise ModelLoadError(
        f"{source}: unsupported architecture (model_type={model_type!r}, architectures={list(architectures)}): "
        f"supported are {allowed}"
    )


def _read_experts(raw: Mapping[str, Any], reader: _FieldReader, spelling: ExpertSpelling) -> dict[str, Any]:
    """The expert fields of a family with experts, as ``spelling`` names them (Transformers 5 calls Qwen3-MoE's
    ``num_experts`` ``num_local_experts``); defaults are Transformers'."""
    experts_key = next((key for key in spelling.count_keys if raw.get(key) is not None), None)
    if experts_key is None:
        names = " (or ".join(repr(key) for key in spelling.count_keys) + ")" * (len(spelling.count_keys) - 1)
        raise ModelLoadError(f"{reader.source}: missing required key {names}")
    if not spelling.layer_pattern:
        return {
            "num_experts": reader.required(experts_key, int),
            "num_experts_per_tok": reader.required("num_experts_per_tok", int),
            "moe_intermediate_size": reader.required(spelling.width_key, int),
            "norm_topk_prob": True,
        }
    layers = raw.get("mlp_only_layers") or []
    if not isinstance(layers, list) or not all(
        isinstance(layer, int) and not isinstance(layer, bool) for layer in layers
    ):
        raise ModelLoadError(f"{reader.source}: 'mlp_only_layers' must be a list of integers, got {layers!r}")
    return {
        "num_experts": reader.required(experts_key, int),
        "num_experts_per_tok": reader.required("num_experts_per_tok", int),
        "moe_intermediate_size": reader.required(spelling.width_key, int),
        "norm_topk_prob": reader.optional("norm_topk_prob", bool, False),
        "decoder_sparse_step": reader.optional("decoder_sparse_step", int, 1),
        "mlp_only_layers": tuple(layers),
    }


def _read_rope(raw: Mapping[str, Any], source: str) -> tuple[float, RopeScaling | None]:
    """Rotary base and scaling from ``rope_parameters`` (Transformers 5) or ``rope_theta``/``rope_scaling`` (4)."""
    parameters = raw.get("rope_parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise ModelLoadError(f"{source}: 'rope_parameters' must be an object, got {parameters!r}")
    scaling = parameters if parameters is not None else raw.get("rope_scaling")
    theta = (parameters or {}).get("rope_theta", raw.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise ModelLoadError(f"{source}: 'rope_theta' must be a number, got {theta!r}")
    if scaling is None:
        return float(theta), None
    if not isinstance(scaling, dict):
        raise ModelLoadError(f"{source}: 'rope_scaling' must be an object or null, got {scaling!r}")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ModelLoadError(
            f"{source}: rope scaling type {rope_type!r} is not supported: supported are {', '.join(ROPE_TYPES)}"
        )
    if rope_type == "default":
        return float(theta), None
    values: dict[str, Any] = {}
    for name in _ROPE_SCALING_FIELDS[rope_type]:
        value = scaling.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ModelLoadError(f"{source}: {rope_type} rope scaling needs a number {name!r}, got {value!r}")
        values[name] = int(value) if name == "original_max_position_embeddings" else float(value)
    return float(theta), RopeScaling(rope_type, **values)


def _read_dtype(raw: Mapping[str, Any], source: str) -> str:
    dtype = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    if dtype not in SUPPORTED_DTYPES:
        raise ModelLoadError(f"{source}: dtype {dtype!r} is not supported: supported are {', '.join(SUPPORTED_DTYPES)}")
    return str(dtype)


def _read_token_ids(value: Any, source: str) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(item, int) and not isinstance(item, bool) for item in values):
        raise ModelLoadError(f"{source}: 'eos_token_id' must be an integer or a list of integers, got {value!r}")
    return tuple(values)


def _write_token_ids(token_ids: tuple[int, ...]) -> int | list[int] | None:
    if not token_ids:
        return None
    return token_ids[0] if len(token_ids) == 1 else list(token_ids)
