"""Where a resolved value came from, and which user-given sources outrank which.

``CudaGraphConfig.sources`` holds ``str(origin)`` for every value; ``--explain`` prints them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class OriginKind(enum.Enum):
    """The kinds of source a value can have."""

    JSON = "json"
    FLAG = "flag"
    LEGACY_FLAG = "legacy flag"
    DEFAULT = "default"
    RULE = "rule"
    DERIVED = "derived"


PRECEDENCE: dict[OriginKind, int] = {OriginKind.JSON: 3, OriginKind.FLAG: 2, OriginKind.LEGACY_FLAG: 1}
"""User-given sources, higher wins: ``--cuda-graph-mode`` JSON > per-phase flags > legacy flags (> defaults)."""


@dataclass(frozen=True)
class Origin:
    """One source of a value: its kind and the flag, rule or reason behind it."""

    kind: OriginKind
    detail: str = ""
    note: str = field(default="", compare=False)
    """A remark on the value: how it was spelled, when that matters (``legacy value 'tcpcg'``), or that it goes
    unused; shown, never compared."""

    @property
    def user_given(self) -> bool:
        """Whether the user stated this value (JSON, flag or legacy flag) rather than a default or a rule."""
        return self.kind in PRECEDENCE

    def __str__(self) -> str:
        text = f"{self.kind.value} {self.detail}" if self.detail else self.kind.value
        return f"{text} ({self.note})" if self.note else text
