"""One LoRA adapter in host memory: its rank, its scaling and its low-rank factors per (layer, target module), read
from a PEFT directory (``adapter_config.json`` + ``adapter_model.safetensors``) or built from tensors, and written
back as one. Nothing here
touches the slots the graphs read (``slots.AdapterSlots`` copies an adapter in)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import LoraError, target_name

_PEFT_KEY = re.compile(
    r"^(?:base_model\.model\.)?(?:model\.)?layers\.(?P<layer>\d+)\.(?:self_attn|mlp)\.(?P<module>\w+?)"
    r"\.lora_(?P<factor>[AB])(?:\.default)?\.weight$"
)
"""A PEFT tensor name: ``base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight``."""

_UNSUPPORTED_PEFT_OPTIONS = {
    "fan_in_fan_out": (False, "factors stored transposed"),
    "use_dora": (False, "DoRA's magnitude vectors"),
    "modules_to_save": (None, "fully trained modules"),
}
"""adapter_config.json keys whose non-default values the engine cannot apply: key -> (default, what it would need)."""


PEFT_FILES = "adapter_config.json and adapter_model.safetensors"
"""What a PEFT adapter directory holds (the two files ``from_peft`` reads)."""


@dataclass(frozen=True)
class LoraFactors:
    """The low-rank factors of one module: ``delta = B @ A`` (``A`` ``[rank, in]``, ``B`` ``[out, rank]``)."""

    a: torch.Tensor
    b: torch.Tensor


@dataclass(frozen=True)
class LoraAdapter:
    """A LoRA adapter: ``W + scaling * B @ A`` for each (layer, target module) it has factors of.

    Example:
        >>> a, b = torch.zeros(4, 64), torch.zeros(96, 4)
        >>> adapter = LoraAdapter.from_tensors({(0, "q"): (a, b)}, alpha=8)
        >>> adapter.rank, adapter.scaling
        (4, 2.0)
    """

    rank: int
    scaling: float
    """Multiplies every delta: ``lora_alpha / rank`` (``lora_alpha / sqrt(rank)`` for rsLoRA)."""
    factors: Mapping[tuple[int, str], LoraFactors]
    """``(layer, PEFT module name) -> factors``."""

    def __post_init__(self) -> None:
        for (layer, module), factors in self.factors.items():
            a, b = factors.a, factors.b
            if a.dim() != 2 or b.dim() != 2 or a.shape[0] != self.rank or b.shape[1] != self.rank:
                raise LoraError(
                    f"LoRA factors of layer {layer} {module} have shapes A {tuple(a.shape)}, B {tuple(b.shape)}: "
                    f"expected A [rank, in] and B [out, rank] with the adapter's rank {self.rank}"
                )

    @property
    def target_modules(self) -> frozenset[str]:
        """The modules this adapter has factors of."""
        return frozenset(module for _, module in self.factors)

    @classmethod
    def from_tensors(
        cls, factors: Mapping[tuple[int, str], tuple[torch.Tensor, torch.Tensor]], alpha: float | None = None
    ) -> LoraAdapter:
        """An adapter from ``(layer, module) -> (A [rank, in], B [out, rank])`` (module: ``q_proj`` or ``q``); its
        scaling is ``alpha / rank`` (``alpha`` defaults to the rank: scaling 1)."""
        if not factors:
            raise LoraError("a LoRA adapter needs factors of at least one (layer, module)")
        ranks = {a.shape[0] for a, _ in factors.values()}
        if len(ranks) != 1:
            raise LoraError(f"every module of one adapter must have one rank; got ranks {sorted(ranks)}")
        rank = ranks.pop()
        scaling = (alpha if alpha is not None else rank) / rank
        named = {(layer, target_name(module)): LoraFactors(a, b) for (layer, module), (a, b) in factors.items()}
        return cls(rank, scaling, named)

    @classmethod
    def from_peft(cls, path: str | Path) -> LoraAdapter:
        """Read a PEFT adapter directory: ``adapter_config.json`` (``r``, ``lora_alpha``, ``use_rslora``) and
        ``adapter_model.safetensors`` (``...layers.{i}.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight``)."""
        from safetensors.torch import load_file

        directory = Path(path)
        config_path, weights_path = directory / "adapter_config.json", directory / "adapter_model.safetensors"
        missing = next((needed.name for needed in (config_path, weights_path) if not needed.is_file()), None)
        if missing is not None:
            what = f"has no {missing}" if directory.is_dir() else "is not a directory"
            raise LoraError(f"{directory} {what}; allowed: a PEFT adapter directory ({PEFT_FILES})")
        config = json.loads(config_path.read_text())
        for key, (default, needs) in _UNSUPPORTED_PEFT_OPTIONS.items():
            if config.get(key, default) not in (default, [], False):
                raise LoraError(f"{config_path}: {key}={config[key]!r} needs {needs}, which the engine does not apply")
        rank = int(config["r"])
        alpha = float(config.get("lora_alpha", rank))
        scaling = alpha / math.sqrt(rank) if config.get("use_rslora", False) else alpha / rank
        tensors = load_file(str(weights_path))
        pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
        for key, tensor in tensors.items():
            match = _PEFT_KEY.match(key)
            if match is None:
                raise LoraError(
                    f"{weights_path}: tensor {key!r} is not a LoRA factor of a layer's projection (expected names "
                    "like base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight)"
                )
            module = target_name(match["module"])
            pairs.setdefault((int(match["layer"]), module), {})[match["factor"]] = tensor
        factors = {}
        for (layer, module), pair in pairs.items():
            if set(pair) != {"A", "B"}:
                raise LoraError(f"{weights_path}: layer {layer} {module} has lora_{''.join(pair)} but not both A and B")
            factors[(layer, module)] = LoraFactors(pair["A"], pair["B"])
        return cls(rank, scaling, factors)

    def save_peft(self, path: str | Path) -> Path:
        """Write this adapter as a PEFT adapter directory that ``from_peft`` reads back equal: ``adapter_config.json``
        (``r``, ``lora_alpha`` = ``scaling * rank``, ``target_modules``) and ``adapter_model.safetensors`` (the
        factors on the CPU, under PEFT's names). Returns the directory (created when missing)."""
        from safetensors.torch import save_file

        directory = Path(path)
        directory.mkdir(parents=True, exist_ok=True)
        config = {
            "peft_type": "LORA",
            "r": self.rank,
            "lora_alpha": self.scaling * self.rank,
            "target_modules": sorted(self.target_modules),
        }
        (directory / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
        tensors = {}
        for (layer, module), factors in self.factors.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = factors.a.detach().contiguous().cpu()
            tensors[f"{prefix}.lora_B.weight"] = factors.b.detach().contiguous().cpu()
        save_file(tensors, str(directory / "adapter_model.safetensors"))
        return directory
