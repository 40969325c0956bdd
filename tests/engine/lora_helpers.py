"""Shared pieces of the LoRA tests: a tiny model, random adapters, and the reference that merges an adapter into
the weights (``W + scaling * B @ A``, as PEFT's ``merge_and_unload`` does)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import torch
from lora_factors import TARGETS, random_lora_adapter

from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
from cudagraph.engine.batch import SamplingParams
from cudagraph.engine.generate import generate
from cudagraph.engine.lora import LORA_TARGETS, LoraAdapter, LoraConfig
from cudagraph.engine.model import CausalLM, model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner

PRESET = "tiny-llama-random"
CONFIG = CudaGraphConfig(
    decode=PhaseConfig(Backend.FULL, (1, 2, 4, 8), 8), prefill=PhaseConfig(Backend.BREAKABLE, (16, 32, 64), 64)
)
CACHE = CacheConfig(max_num_reqs=8, max_context_len=48)
LORA = LoraConfig(max_loras=3, max_rank=8)


def base_model(preset: str = PRESET, seed: int = 0, device: str = "cpu") -> CausalLM:
    """The tiny float32 model every engine of a test shares the weights of."""
    return random_model(model_config_from_preset(preset), seed=seed, dtype="float32", device=device)


def random_adapter(
    model: CausalLM, rank: int, seed: int, targets: Sequence[str] = TARGETS, alpha: float | None = None
) -> LoraAdapter:
    """Random factors of ``rank`` for every layer and target of ``model`` (its rank's slice), on its device."""
    generator = torch.Generator().manual_seed(seed)
    return random_lora_adapter(
        model.local_config,
        rank,
        generator,
        num_layers=len(model.layers),
        targets=targets,
        device=model.device,
        alpha=alpha,
    )


def merged(model: CausalLM, adapter: LoraAdapter | None) -> CausalLM:
    """A copy of ``model`` with ``adapter`` merged into its weights (``None``: the base model, copied)."""
    merged_model = copy.deepcopy(model)
    if adapter is None:
        return merged_model
    config = merged_model.local_config
    with torch.no_grad():
        for (layer, name), factors in adapter.factors.items():
            target = LORA_TARGETS[name]
            attention = merged_model.layers[layer].self_attn
            weight = attention.qkv_weight if target.projection == "qkv" else attention.o_weight
            start, stop = target.rows(config)
            weight[start:stop] += adapter.scaling * (factors.b.double() @ factors.a.double()).to(weight.dtype)
    return merged_model


def engine(model: CausalLM, lora: LoraConfig | None = LORA) -> ModelRunner:
    """An engine over ``model`` (its own copy) serving adapters by ``lora``."""
    return ModelRunner(copy.deepcopy(model), CONFIG, cache_config=CACHE, lora_config=lora)


def prompts(count: int, seed: int = 1) -> list[list[int]]:
    """``count`` random prompts of 3..14 tokens."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 15, (count,), generator=generator).tolist()
    return [torch.randint(0, 512, (n,), generator=generator).tolist() for n in lengths]


def greedy(model_runner: ModelRunner, prompt_list: list[list[int]], names: Sequence[str | None]) -> list[list[int]]:
    """Greedy tokens of each prompt through its adapter (8 new tokens each)."""
    params = [SamplingParams(max_new_tokens=8, lora_name=name) for name in names]
    return [output.output_token_ids for output in generate(model_runner, prompt_list, params)]


def write_peft(adapter: LoraAdapter, directory: Path) -> Path:
    """``adapter`` as a PEFT adapter directory (``LoraAdapter.save_peft``, checked to read back equal)."""
    adapter.save_peft(directory)
    back = LoraAdapter.from_peft(directory)
    assert (back.rank, back.scaling, set(back.factors)) == (adapter.rank, adapter.scaling, set(adapter.factors))
    for key, factors in adapter.factors.items():
        assert torch.equal(back.factors[key].a, factors.a.cpu()) and torch.equal(back.factors[key].b, factors.b.cpu())
    return directory
