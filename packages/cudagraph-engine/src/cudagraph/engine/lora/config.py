"""What the engine's LoRA support is sized for (``LoraConfig``) and which projections an adapter may target
(``LORA_TARGETS``): the vocabulary every other ``lora`` module reads. It imports no model code, so the model layers
never depend on it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class LoraError(ValueError):
    """An adapter or a LoRA setting the engine cannot take: the message says what was wrong and what is allowed."""


@dataclass(frozen=True)
class LoraTarget:
    """One module an adapter may target: the fused projection it adds to and the rows of that projection's output
    it writes (q, k and v share the fused q/k/v projection, each its own row range)."""

    name: str
    """The module's name in a PEFT checkpoint (``q_proj``)."""
    projection: str
    """The layer's projection the delta is added to: ``qkv`` (the fused q/k/v matmul) or ``o``."""
    rows: Callable[[Any], tuple[int, int]]
    """``config -> (start, stop)``: the output rows of the projection this module owns."""
    in_features: Callable[[Any], int]
    """``config -> width`` of the projection's input."""

    def out_features(self, config: Any) -> int:
        """How many output rows this module has."""
        start, stop = self.rows(config)
        return stop - start


LORA_TARGETS: dict[str, LoraTarget] = {
    target.name: target
    for target in (
        LoraTarget("q_proj", "qkv", lambda c: (0, c.q_size), lambda c: c.hidden_size),
        LoraTarget("k_proj", "qkv", lambda c: (c.q_size, c.q_size + c.kv_size), lambda c: c.hidden_size),
        LoraTarget(
            "v_proj", "qkv", lambda c: (c.q_size + c.kv_size, c.q_size + 2 * c.kv_size), lambda c: c.hidden_size
        ),
        LoraTarget("o_proj", "o", lambda c: (0, c.hidden_size), lambda c: c.q_size),
    )
}
"""Every module an adapter may target, by PEFT name, in the order their deltas are stacked."""

_SHORT_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj"}


def target_name(name: str) -> str:
    """The PEFT name of target ``name`` (``q`` or ``q_proj``); an unknown one is a ``LoraError``."""
    full = _SHORT_NAMES.get(name, name)
    if full not in LORA_TARGETS:
        raise LoraError(
            f"unknown LoRA target module {name!r}: the engine applies adapters to {', '.join(LORA_TARGETS)} "
            "(or q, k, v, o)"
        )
    return full


@dataclass(frozen=True)
class LoraConfig:
    """The fixed room adapters are loaded into: ``max_loras`` slots of rank up to ``max_rank`` on ``target_modules``.

    Every shape the graphs see follows from these (an adapter of smaller rank is padded with zeros), so one captured
    graph serves any mix of loaded adapters, and loading one into a slot recaptures nothing.
    """

    max_loras: int = 4
    """Adapters loaded at once (slots)."""
    max_rank: int = 16
    """The largest adapter rank a slot holds."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """The modules adapters may target (PEFT names, or q/k/v/o); an adapter may target fewer."""

    def __post_init__(self) -> None:
        for field_name in ("max_loras", "max_rank"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LoraError(f"LoraConfig.{field_name} must be a whole number, at least 1; got {value!r}")
        if not self.target_modules:
            raise LoraError(f"LoraConfig.target_modules is empty: name at least one of {', '.join(LORA_TARGETS)}")
        names = {target_name(name) for name in self.target_modules}
        # Stacking order is the table's, whatever order the user wrote.
        object.__setattr__(self, "target_modules", tuple(name for name in LORA_TARGETS if name in names))

    def targets(self, projection: str) -> tuple[LoraTarget, ...]:
        """The configured targets that add to ``projection`` (``qkv`` or ``o``), in stacking order."""
        return tuple(LORA_TARGETS[name] for name in self.target_modules if LORA_TARGETS[name].projection == projection)
