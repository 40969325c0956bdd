"""A runner's graph-memory budget: an amount of device memory, or a share of what is free when capture starts.

Spellings (flag or JSON): ``"1.5GiB"``, ``"512MiB"``, ``"2GB"`` (decimal units are read as written), a bare number of
GiB (``"2"``, ``1.5``), or a percentage of the free device memory at capture (``"20%"``). Numbers are read exactly
(a fraction of a byte rounds down), and ``str(budget)`` is the shortest spelling that reads back to the same budget,
so a budget survives ``to_cli_args`` unchanged. Pure Python: the runner turns a budget into bytes with
:meth:`MemoryBudget.limit_bytes` once it has read the free memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction

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

_NUMBER = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]{1,3})?")
"""A decimal number as a budget is written (lower-cased): no sign, no fraction bar, an exponent of up to 3 digits."""

_SHOWN_UNITS: tuple[str, ...] = ("GiB", "GB", "MiB", "MB", "KiB", "kB")
"""Units ``str`` tries, largest first, before falling back to bytes."""
_SHOWN_DIGITS = 6
"""The most significant digits ``str`` writes before trying a smaller unit."""

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
        """The shortest spelling that ``read_memory_budget`` reads back to this budget (``"1.5GiB"``, ``"20%"``)."""
        if self.bytes is not None:
            return _bytes_text(self.bytes)
        assert self.free_fraction is not None
        return _percent_text(self.free_fraction) + "%"


def read_memory_budget(label: str, raw: object) -> MemoryBudget:
    """``raw`` (a flag's text or a JSON value) as a budget; a ``ConfigError`` naming ``label`` and the spellings.

    Example:
        >>> read_memory_budget("--decode-cuda-graph-memory-budget", "1.5GiB")
        MemoryBudget(bytes=1610612736, free_fraction=None)
        >>> str(read_memory_budget("budget", 0.25)), str(read_memory_budget("budget", "12.5 %"))
        ('256MiB', '12.5%')
    """
    if isinstance(raw, MemoryBudget):
        return raw
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise ConfigError(f"{label}: {raw!r} is not allowed; allowed: {BUDGET_EXAMPLES}")
    # Shown as text whether it came as a number or a string, so a command line and a Python caller read the same.
    shown = repr(str(raw))
    text = str(raw).strip().replace(" ", "").lower()
    try:
        if text.endswith("%"):
            return MemoryBudget(free_fraction=float(_number(text[:-1]) / 100))
        number, unit = _split_unit(text)
        return MemoryBudget(bytes=int(_number(number) * _UNIT_BYTES[unit]))
    except (ValueError, KeyError, ZeroDivisionError, OverflowError, ConfigError):
        raise ConfigError(
            f"{label}: {shown} is not allowed; allowed: a positive amount, {BUDGET_EXAMPLES}, a share up to 100%"
        ) from None


def _number(text: str) -> Fraction:
    """``text`` as an exact number; ``ValueError`` unless it is a plain decimal (see ``_NUMBER``)."""
    if not _NUMBER.fullmatch(text):
        raise ValueError(text)
    return Fraction(text)


def _split_unit(text: str) -> tuple[str, str]:
    """``"1.5gib"`` -> ``("1.5", "gib")``; a bare number is GiB."""
    head = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(head) :] or "gib"
    return head, unit


def _bytes_text(amount: int) -> str:
    for unit in _SHOWN_UNITS:
        scale = _UNIT_BYTES[unit.lower()]
        if amount < scale:
            continue
        for digits in range(1, _SHOWN_DIGITS + 1):
            text = _rounded(Decimal(amount), Decimal(scale), digits)
            if int(Fraction(text) * scale) == amount:
                return text + unit
    return f"{amount}B"


def _percent_text(fraction: float) -> str:
    # Decimal(fraction) is the float's exact value, so the exact percentage (at most about 770 digits) always reads
    # back; a few digits usually do.
    for digits in (*range(1, 18), 2000):
        text = _rounded(Decimal(fraction), Decimal("0.01"), digits)
        if float(Fraction(text) / 100) == fraction:
            return text
    raise AssertionError(f"no spelling of {fraction!r}")  # unreachable: 2000 digits hold any float times 100


def _rounded(numerator: Decimal, denominator: Decimal, digits: int) -> str:
    """``numerator / denominator`` rounded to ``digits`` significant digits, positional, no trailing zeros."""
    with localcontext() as context:
        context.prec = digits
        quotient = numerator / denominator
    return format(quotient.normalize(), "f")
