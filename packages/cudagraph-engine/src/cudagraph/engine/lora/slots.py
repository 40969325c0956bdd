"""``AdapterSlots``: the device tensors every LoRA graph reads, allocated once and written in place.

Per layer and projection (``qkv``, ``o``): ``a`` stacks every target's A factors, ``[targets, slots, max_rank, in]``
(so one matmul shrinks the input for all of q, k and v), and ``b`` holds every target's B in its own rows and its
own column block, ``[rows, targets, slots, max_rank]``, zeros elsewhere (so one matmul expands every target's and
every slot's ranks into the projection's output at once: the zero blocks cost a little bandwidth, far less than the
launches they save). ``scale_table`` ``[slots + 1, slots * max_rank]`` holds, in row ``s``, slot ``s``'s scaling
over that slot's ranks and zeros elsewhere; its last row, all zeros, is the "no adapter" row.

Loading copies into these tensors (``copy_``; an adapter of smaller rank is padded with zeros) and unloading zeroes
a slot: their storage never moves, so captured graphs stay valid and see the new adapter on their next replay.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .adapter import LoraAdapter
from .config import LORA_TARGETS, LoraConfig, LoraError, LoraTarget


@dataclass(frozen=True)
class ProjectionSlots:
    """One layer's slot tensors for one projection (``qkv`` or ``o``)."""

    targets: tuple[LoraTarget, ...]
    a: torch.Tensor
    """``[len(targets), slots, max_rank, in]``."""
    b: torch.Tensor
    """``[row_stop - row_start, len(targets), slots, max_rank]``: target ``t``'s B in its own rows of column block
    ``t``, zeros elsewhere."""
    rows: tuple[tuple[int, int], ...]
    """Per target, the output rows of the projection it adds to."""

    @property
    def row_start(self) -> int:
        """The first output row any target adds to (``b``'s row 0)."""
        return min(start for start, _ in self.rows)

    @property
    def row_stop(self) -> int:
        """One past the last output row any target adds to."""
        return max(stop for _, stop in self.rows)

    def target_b(self, index: int) -> torch.Tensor:
        """Target ``index``'s B: ``[out, slots, max_rank]``, a view of ``b``."""
        start, stop = self.rows[index]
        return self.b[start - self.row_start : stop - self.row_start, index]


class AdapterSlots:
    """``config.max_loras`` adapter slots for every layer of a model of ``model_config`` (one rank's sizes), in
    ``dtype`` on ``device``; all zeros (no adapter) until ``load``."""

    def __init__(
        self, config: LoraConfig, model_config: object, num_layers: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.config = config
        self.model_config = model_config
        self.num_layers = num_layers
        slots, rank = config.max_loras, config.max_rank
        self.projections: list[dict[str, ProjectionSlots]] = []
        """Per layer, projection name -> its slot tensors (only projections some target adds to)."""
        for _ in range(num_layers):
            layer: dict[str, ProjectionSlots] = {}
            for projection in ("qkv", "o"):
                targets = config.targets(projection)
                if not targets:
                    continue
                in_features = targets[0].in_features(model_config)
                rows = tuple(t.rows(model_config) for t in targets)
                span = max(stop for _, stop in rows) - min(start for start, _ in rows)
                a = torch.zeros((len(targets), slots, rank, in_features), dtype=dtype, device=device)
                b = torch.zeros((span, len(targets), slots, rank), dtype=dtype, device=device)
                layer[projection] = ProjectionSlots(targets, a, b, rows)
            self.projections.append(layer)
        self.scale_table = torch.zeros((slots + 1, slots * rank), dtype=dtype, device=device)
        """Row ``s``: slot ``s``'s scaling over its ranks' columns; the last row (``none_index``) is all zeros."""
        self.scaling: list[float] = [0.0] * slots
        """Each slot's scaling on the host (0: empty)."""

    @property
    def none_index(self) -> int:
        """The index of the all-zero row of ``scale_table``: a token without an adapter reads it (delta 0)."""
        return self.config.max_loras

    def _projection(self, layer: int, target: str) -> tuple[ProjectionSlots, int]:
        projection = LORA_TARGETS[target].projection
        slots = self.projections[layer].get(projection)
        names = [t.name for t in slots.targets] if slots is not None else []
        if slots is None or target not in names:
            raise LoraError(
                f"LoRA target {target!r} is not configured: LoraConfig.target_modules is "
                f"{', '.join(self.config.target_modules)}"
            )
        return slots, names.index(target)

    def a(self, layer: int, target: str) -> torch.Tensor:
        """Target ``target``'s stacked A of ``layer``: ``[slots, max_rank, in]`` (a view of the slot storage)."""
        slots, index = self._projection(layer, target)
        return slots.a[index]

    def b(self, layer: int, target: str) -> torch.Tensor:
        """Target ``target``'s stacked B of ``layer``: ``[slots, out, max_rank]`` (a view of the slot storage)."""
        slots, index = self._projection(layer, target)
        return slots.target_b(index).permute(1, 0, 2)

    def check(self, adapter: LoraAdapter) -> None:
        """Raise ``LoraError`` when ``adapter`` does not fit these slots (rank, targets, layers, shapes)."""
        if adapter.rank > self.config.max_rank:
            raise LoraError(
                f"LoRA adapter rank {adapter.rank} exceeds LoraConfig.max_rank={self.config.max_rank}: raise "
                "max_rank (the graphs are captured at it) or use an adapter of lower rank"
            )
        for (layer, target), factors in adapter.factors.items():
            if not 0 <= layer < self.num_layers:
                raise LoraError(f"LoRA adapter has factors of layer {layer}; the model has {self.num_layers} layers")
            self._projection(layer, target)
            spec = LORA_TARGETS[target]
            want_a = (adapter.rank, spec.in_features(self.model_config))
            want_b = (spec.out_features(self.model_config), adapter.rank)
            if tuple(factors.a.shape) != want_a or tuple(factors.b.shape) != want_b:
                raise LoraError(
                    f"LoRA factors of layer {layer} {target} have shapes A {tuple(factors.a.shape)}, "
                    f"B {tuple(factors.b.shape)}; this model needs A {want_a} and B {want_b}"
                )

    def load(self, slot: int, adapter: LoraAdapter) -> None:
        """Copy ``adapter`` into ``slot`` in place (checked first; targets it lacks are zeroed in that slot)."""
        self.check(adapter)
        self.clear(slot)
        rank = adapter.rank
        for (layer, target), factors in adapter.factors.items():
            self.a(layer, target)[slot, :rank].copy_(factors.a)
            self.b(layer, target)[slot, :, :rank].copy_(factors.b)
        self._set_scaling(slot, adapter.scaling)

    def clear(self, slot: int) -> None:
        """Zero ``slot``: its tokens get no delta until something is loaded there again."""
        if not 0 <= slot < self.config.max_loras:
            raise LoraError(f"LoRA slot {slot} does not exist: slots are 0..{self.config.max_loras - 1}")
        for layer in self.projections:
            for projection in layer.values():
                projection.a[:, slot].zero_()
                projection.b[:, :, slot].zero_()
        self._set_scaling(slot, 0.0)

    def _set_scaling(self, slot: int, scaling: float) -> None:
        rank = self.config.max_rank
        self.scale_table[slot, slot * rank : (slot + 1) * rank].fill_(scaling)
        self.scaling[slot] = scaling

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """Every slot tensor by a stable name (what the graphs read besides the model's own tensors)."""
        tensors = {"lora.scale_table": self.scale_table}
        for layer_id, layer in enumerate(self.projections):
            for name, projection in layer.items():
                tensors[f"lora.layers.{layer_id}.{name}.a"] = projection.a
                tensors[f"lora.layers.{layer_id}.{name}.b"] = projection.b
        return tensors
