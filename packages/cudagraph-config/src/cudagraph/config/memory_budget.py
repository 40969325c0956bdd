"""A runner's graph-memory budget: an amount of device memory, or a share of what is free when capture starts.

Spellings (flag or JSON): ``"1.5GiB"``, ``"512MiB"``, ``"2GB"`` (decimal units are read as written), a bare number of
GiB (``"2"``, ``1.5``), or a percentage of the free device memory at capture (``"20%"``). Pure Python: the runner
turns a budget into bytes with :meth:`MemoryBudget.limit_bytes` once it has read the free memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .vocabulary import ConfigError

_UNIT_BYTES: dict[str, int] = {
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
"""Units a budget may be written in (case-insensitive); a number without a unit is GiB."""

BUDGET_EXAMPLES = '"1.5GiB", "512MiB", "2" (GiB) or "20%" (of the free memory at capture)'


@dataclass(frozen=True)
class MemoryBudget:
    """The most device memory one runner's graphs may take: ``bytes``, or ``free_fraction`` of the free memory at
    the start of its capture (exactly one of the two is set)."""

    bytes: int | None = None
    free_fraction: float | None = None

    def __post_init__(self) -> None:
        if (self.bytes is None) == (self.free_fraction is None):
            raise ConfigError(f"memory budget: give bytes or free_fraction, exactly one; e.g. {BUDGET_EXAMPLES}")
        if self.bytes is not None and self.bytes <= 0:
            raise ConfigError(f"memory budget: {self.bytes} bytes is not allowed; allowed: a positive amount")
        if self.free_fraction is not None and not 0 < self.free_fraction <= 1:
            raise ConfigError(
                f"memory budget: {self.free_fraction:.0%} of free memory is not allowed; allowed: above 0% up to 100%"
            )

    def limit_bytes(self, free_bytes: int) -> int:
        """The budget in bytes, given the device's free memory when capture starts."""
        if self.bytes is not None:
            return self.bytes
        assert self.free_fraction is not None  # __post_init__ checked it
        return int(free_bytes * self.free_fraction)

    def __str__(self) -> str:
        if self.bytes is not None:
            if self.bytes < 2**30:
                return f"{self.bytes / 2**20:g}MiB"
            return f"{self.bytes / 2**30:g}GiB"
        assert self.free_fraction is not None
        return f"{self.free_fraction * 100:g}%"


def read_memory_budget(label: str, raw: object) -> MemoryBudget:
    """``raw`` (a flag's text or a JSON value) as a budget; a ``ConfigError`` naming ``label`` and the spellings."""
    if isinstance(raw, MemoryBudget):
        return raw
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise ConfigError(f"{label}: {raw!r} is not allowed; allowed: {BUDGET_EXAMPLES}")
    text = str(raw).strip().replace(" ", "").lower()
    try:
        if text.endswith("%"):
            fraction = float(text[:-1]) / 100
            if not math.isfinite(fraction):
                raise ValueError(text)
            return MemoryBudget(free_fraction=fraction)
        number, unit = _split_unit(text)
        amount = float(number) * _UNIT_BYTES[unit]
        if not math.isfinite(amount):
            raise ValueError(text)
        return MemoryBudget(bytes=int(amount))
    except (ValueError, KeyError, ConfigError):
        raise ConfigError(
            f"{label}: {raw!r} is not allowed; allowed: a positive amount, {BUDGET_EXAMPLES}, a share up to 100%"
        ) from None


def _split_unit(text: str) -> tuple[str, str]:
    """``"1.5gib"`` -> ``("1.5", "gib")``; a bare number is GiB."""
    head = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(head) :] or "gib"
    return head, unit
