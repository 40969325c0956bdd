"""Llama / Qwen2 / Qwen3 / Qwen3-MoE / Mixtral decoder: its architecture (``ModelConfig``), the model (sparse
experts in ``moe``; an EAGLE draft head over it in ``eagle``), Hugging Face checkpoint I/O, random weights, presets
and a dense single-sequence reference. The kernel sets a layer computes through are ``cudagraph.engine.kernels``.

The model takes attention from its caller (``attend``), so the engine's paged backends, CUDA-graph capture and the
dense reference all drive the same weights.
"""

from .architecture import FAMILIES, ROPE_TYPES, SUPPORTED_DTYPES, ArchitectureFamily, ModelConfig, RopeScaling
from .causal_lm import CausalLM, resolve_dtype
from .checkpoint import TensorSlot, checkpoint_slots, load_model, save_model
from .eagle import EAGLE_PRESETS, EagleHead, load_eagle_head, random_eagle_head, save_eagle_head, self_draft_head
from .errors import ModelFileNotFoundError, ModelLoadError, TensorParallelError
from .layers import AttendFn
from .parallel import MOE_A2A_BACKENDS, SINGLE_RANK, RowRange, ShardPlan
from .presets import PRESETS, model_config_from_preset
from .random_init import random_model
from .reference import dense_attend, dense_causal_attention, reference_greedy, reference_logits

__all__ = [
    "EAGLE_PRESETS",
    "FAMILIES",
    "MOE_A2A_BACKENDS",
    "PRESETS",
    "ROPE_TYPES",
    "SINGLE_RANK",
    "SUPPORTED_DTYPES",
    "ArchitectureFamily",
    "AttendFn",
    "CausalLM",
    "EagleHead",
    "ModelConfig",
    "ModelFileNotFoundError",
    "ModelLoadError",
    "RopeScaling",
    "RowRange",
    "ShardPlan",
    "TensorParallelError",
    "TensorSlot",
    "checkpoint_slots",
    "dense_attend",
    "dense_causal_attention",
    "load_eagle_head",
    "load_model",
    "model_config_from_preset",
    "random_eagle_head",
    "random_model",
    "reference_greedy",
    "reference_logits",
    "resolve_dtype",
    "save_eagle_head",
    "save_model",
    "self_draft_head",
]
