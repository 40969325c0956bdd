"""``LoraManager``: adapters by name in the model's slots, and the per-step indices of the requests that use them.

It attaches a ``LayerAdapters`` to every attention layer of the model (``Attention.adapters``); those add the deltas
to the q/k/v and output projections while ``step.active`` is on. Loading an adapter copies it into a slot in place,
so nothing captured needs capturing again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .adapter import LoraAdapter
from .apply import add_delta
from .config import LoraConfig, LoraError
from .slots import AdapterSlots, ProjectionSlots
from .step import LoraStep

if TYPE_CHECKING:
    from ..kernels import LayerKernels


class LayerAdapters:
    """One attention layer's LoRA hook (``cudagraph.engine.model.layers.ProjectionAdapters``): adds the deltas of
    the step's adapters to its q/k/v and output projections."""

    def __init__(self, step: LoraStep, slots: AdapterSlots, layer_id: int) -> None:
        self.step = step
        self.qkv: ProjectionSlots | None = slots.projections[layer_id].get("qkv")
        self.o: ProjectionSlots | None = slots.projections[layer_id].get("o")

    @property
    def active(self) -> bool:
        """Whether the forward now running applies adapters."""
        return self.step.active

    def _add(
        self, projection: ProjectionSlots | None, x: torch.Tensor, out: torch.Tensor, kernels: LayerKernels
    ) -> None:
        if projection is not None:
            add_delta(kernels, out, x, projection, self.step.scales[: x.shape[0]])

    def add_to_qkv(self, x: torch.Tensor, qkv: torch.Tensor, kernels: LayerKernels) -> None:
        """Add the q/k/v deltas of the normed input ``x`` to ``qkv`` in place (through ``kernels``' fused delta
        where the layer's kernel set has one: ``apply.add_delta``)."""
        self._add(self.qkv, x, qkv, kernels)

    def add_to_o(self, x: torch.Tensor, out: torch.Tensor, kernels: LayerKernels) -> None:
        """Add the output projection's delta of the attention output ``x`` to ``out`` in place (as ``add_to_qkv``)."""
        self._add(self.o, x, out, kernels)


class LoraManager:
    """Adapter slots for ``model`` (a ``CausalLM`` on one rank), adapters loaded into them by name, and the step's
    per-token indices (``step``) for up to ``max_num_tokens`` tokens a step.

    Example:
        >>> from cudagraph.engine.model import model_config_from_preset, random_model
        >>> model = random_model(model_config_from_preset("tiny-llama-random"), dtype="float32")
        >>> lora = LoraManager(LoraConfig(max_loras=2, max_rank=4), model, max_num_tokens=64)
        >>> a, b = torch.randn(4, 64), torch.randn(64, 4)
        >>> lora.load("sql", LoraAdapter.from_tensors({(0, "q"): (a, b)}))
        0
        >>> lora.index_of("sql"), lora.index_of(None)
        (0, 2)
    """

    def __init__(self, config: LoraConfig, model: Any, max_num_tokens: int) -> None:
        if getattr(model, "reduce_group", None) is not None:
            raise LoraError("LoRA adapters on a tensor-parallel shard are not supported yet: run the model on one rank")
        self.config = config
        self.slots = AdapterSlots(config, model.local_config, len(model.layers), model.dtype, model.device)
        self.step = LoraStep(max_num_tokens, self.slots.scale_table)
        self.slot_of: dict[str, int] = {}
        """Loaded adapters: name -> slot."""
        for layer_id, layer in enumerate(model.layers):
            layer.self_attn.adapters = LayerAdapters(self.step, self.slots, layer_id)

    def load(self, name: str, source: LoraAdapter | str | Path) -> int:
        """Load adapter ``name`` from ``source`` (an adapter, or a PEFT directory) into a slot in place and return
        the slot: the one ``name`` already has (replaced), else the first free one."""
        adapter = source if isinstance(source, LoraAdapter) else LoraAdapter.from_peft(source)
        self.slots.check(adapter)  # before a slot is chosen: a bad adapter changes nothing
        slot = self.slot_of.get(name)
        if slot is None:
            used = set(self.slot_of.values())
            free = [index for index in range(self.config.max_loras) if index not in used]
            if not free:
                raise LoraError(
                    f"no free LoRA slot for {name!r}: all {self.config.max_loras} hold "
                    f"{', '.join(sorted(self.slot_of))}; unload one or raise LoraConfig.max_loras"
                )
            slot = free[0]
        self.slots.load(slot, adapter)
        self.slot_of[name] = slot
        return slot

    def unload(self, name: str) -> None:
        """Zero ``name``'s slot and forget it (the slot is free again)."""
        self.slots.clear(self.slot_of.pop(self._known(name)))

    def _known(self, name: str) -> str:
        if name not in self.slot_of:
            loaded = ", ".join(sorted(self.slot_of)) or "none"
            raise LoraError(f"LoRA adapter {name!r} is not loaded (loaded: {loaded}); load it first")
        return name

    def index_of(self, name: str | None) -> int:
        """The slot index a token of adapter ``name`` reads (``None``: the no-adapter row)."""
        return self.step.none_index if name is None else self.slot_of[self._known(name)]

    def write_step(self, names: Sequence[str | None], tokens: Sequence[int]) -> bool:
        """Write the indices of a step whose request ``i`` uses adapter ``names[i]`` for ``tokens[i]`` tokens;
        returns whether any request uses one (the step then needs the LoRA variant)."""
        indices = [self.index_of(name) for name in names]
        self.step.write([index for index, count in zip(indices, tokens, strict=True) for _ in range(count)])
        return any(name is not None for name in names)

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """What the LoRA graphs read besides the model: the slots and the index buffer."""
        return {**self.slots.named_tensors(), "lora.indices": self.step.indices, "lora.scales": self.step.scales}
