"""LoRA adapters under CUDA graphs: fixed slots, per-token slot indices in a persistent buffer, and a batched delta
on the q/k/v and output projections, so one captured graph serves any mix of loaded adapters.

- ``config``: ``LoraConfig`` (slots, max rank, target modules) and the target table.
- ``adapter``: ``LoraAdapter``, read from a PEFT directory or built from tensors.
- ``slots``: ``AdapterSlots``, the device tensors the graphs read, loaded in place.
- ``step``: ``LoraStep``, the per-token index buffer and the host switch of the LoRA forward.
- ``apply``: ``add_lora_delta``, the deltas in plain torch, and ``add_delta``, which takes the layer's kernel set's
  fused delta instead where it has one.
- ``manager``: ``LoraManager``, adapters by name, attached to the model's layers.
"""

from .adapter import LoraAdapter, LoraFactors
from .apply import add_delta, add_lora_delta
from .config import LORA_TARGETS, LoraConfig, LoraError, LoraTarget
from .manager import LayerAdapters, LoraManager
from .slots import AdapterSlots, ProjectionSlots
from .step import LoraStep

__all__ = [
    "LORA_TARGETS",
    "AdapterSlots",
    "LayerAdapters",
    "LoraAdapter",
    "LoraConfig",
    "LoraError",
    "LoraFactors",
    "LoraManager",
    "LoraStep",
    "LoraTarget",
    "ProjectionSlots",
    "add_delta",
    "add_lora_delta",
]
