"""Replay metrics of one phase: replays per bucket with their real and padded tokens, eager steps by reason, and one
warning per window of steps when too many of them ran eagerly for a size reason.

Counting is on the hot path of every step, so it only increments list entries: replays are counted per real size
(the bucket and the padding follow from the size), eager steps per ``EagerReason``. Everything else (rows per
bucket, the JSON, the table) is derived when asked. This module never touches a device.

The warning watches windows of ``window`` consecutive steps (1000 by default). As soon as more than ``eager_share``
(10 %) of a window's steps have run eagerly for a size reason it logs once, naming each reason and the flag that
would capture such batches, and stays quiet until the next window starts. ``close_window()`` (at exit) judges the
steps of the window under way by their own count.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cudagraph.config import Phase

from .routing import EagerReason

logger = logging.getLogger(__name__)

WINDOW_STEPS = 1000
"""Steps per warning window."""
EAGER_SHARE_WARNING = 0.10
"""The share of a window's steps that may run eagerly for a size reason before it warns."""

_REASONS = tuple(EagerReason)
_INDEX = {reason: index for index, reason in enumerate(_REASONS)}
_SIZE_REASONS = frozenset(reason for reason in _REASONS if reason.is_size_reason)


@dataclass(frozen=True)
class BucketRow:
    """What one bucket replayed: steps, the tokens of the real batches, and the padding rows it ran on top."""

    bucket: int
    replays: int
    real_tokens: int
    padded_tokens: int

    @property
    def padding_percent(self) -> float:
        """Padded tokens as a share of all tokens the bucket's replays ran (0 when it never replayed)."""
        total = self.real_tokens + self.padded_tokens
        return 100.0 * self.padded_tokens / total if total else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields, ``padding_percent`` included."""
        return {
            "bucket": self.bucket,
            "replays": self.replays,
            "real_tokens": self.real_tokens,
            "padded_tokens": self.padded_tokens,
            "padding_percent": round(self.padding_percent, 3),
        }


@dataclass(frozen=True)
class EagerRow:
    """The eager steps of one reason: how many, their tokens, and what would capture them (size reasons only)."""

    reason: EagerReason
    steps: int
    tokens: int
    hint: str | None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields: the reason's key and text, counts, the hint."""
        return {
            "reason": self.reason.value,
            "text": self.reason.text,
            "steps": self.steps,
            "tokens": self.tokens,
            "hint": self.hint,
        }


class ReplayMetrics:
    """The steps of one phase, replayed or eager, counted cheaply (see the module docstring).

    A runner counts its own steps; a phase without a runner (disabled, or no CUDA) is counted by whoever runs it
    eagerly, so its table is complete too. ``track_buckets`` tells it which bucket each size replays.
    """

    def __init__(
        self,
        phase: Phase | str,
        *,
        window: int = WINDOW_STEPS,
        eager_share: float = EAGER_SHARE_WARNING,
        label: str | None = None,
    ) -> None:
        if window < 1:
            raise ValueError(f"window {window!r}: a warning window needs at least 1 step")
        if not 0.0 <= eager_share < 1.0:
            raise ValueError(f"eager_share {eager_share!r}: must be a share from 0 (inclusive) to 1 (exclusive)")
        self.phase = Phase(phase)
        self.label: str = label if label is not None else str(self.phase)
        """What the table and warnings call these steps (the phase, or e.g. ``"verify"`` for a verify runner's)."""
        self.window = window
        self.eager_share = eager_share
        self.bucket_by_size: tuple[int | None, ...] = ()
        self.tokens_per_size = 1
        """Tokens a step of size 1 carries (``track_buckets`` sets it: a verify runner's ``query_len``)."""
        """The bucket a batch of each size replays (``None``: no bucket holds it), from the runner."""
        self.replays_by_size: list[int] = []
        """Replays per real size (decode: batch size; prefill: token count)."""
        self.eager_steps: list[int] = [0] * len(_REASONS)
        """Eager steps per reason, in ``EagerReason`` order (``eager_count(reason)`` reads one)."""
        self.eager_tokens: list[int] = [0] * len(_REASONS)
        self.warnings = 0
        """Warnings logged so far (at most one per window)."""
        self.lazy_captures = 0
        """Buckets captured on first use (the lazy capture policy), each by the step that replayed it first."""
        self.lazy_capture_seconds = 0.0
        """Wall time those captures took, warm-ups included."""
        self._start_window()

    # -- counting (every step) --------------------------------------------------------------------------------------

    def count_replay(self, size: int) -> None:
        """One step of ``size`` replayed its bucket's graph."""
        self.replays_by_size[size] += 1
        self._window_steps += 1
        if self._window_steps >= self.window:
            self._start_window()

    def count_eager(self, reason: EagerReason, tokens: int) -> None:
        """One step of ``tokens`` tokens ran eagerly for ``reason``."""
        index = _INDEX[reason]
        self.eager_steps[index] += 1
        self.eager_tokens[index] += tokens
        self._window_steps += 1
        if reason in _SIZE_REASONS:
            self._window_by_reason[index] += 1
            self._window_eager += 1
            if not self._window_warned and self._window_eager > self.eager_share * self.window:
                self._warn()
        if self._window_steps >= self.window:
            self._start_window()

    def count_lazy_capture(self, seconds: float) -> None:
        """One bucket captured on first use, taking ``seconds`` (counted whether or not it kept its graph)."""
        self.lazy_captures += 1
        self.lazy_capture_seconds += seconds

    # -- windows ----------------------------------------------------------------------------------------------------

    def close_window(self) -> None:
        """End the window under way now (at exit): warn if more than ``eager_share`` of its steps so far ran
        eagerly for a size reason and it has not warned yet; the next step starts a new window."""
        if not self._window_warned and self._window_eager > self.eager_share * self._window_steps:
            self._warn()
        self._start_window()

    def _start_window(self) -> None:
        self._window_steps = 0
        self._window_eager = 0
        self._window_by_reason = [0] * len(_REASONS)
        self._window_warned = False

    def _warn(self) -> None:
        parts = []
        for reason, steps in zip(_REASONS, self._window_by_reason, strict=True):
            if steps:
                parts.append(f"{steps} {reason.text} ({reason.hint(self.phase)})")
        logger.warning(
            "%s: %d of the last %d steps ran eagerly for a size reason, over %g %% of a %d-step window: %s",
            self.label,
            self._window_eager,
            self._window_steps,
            100 * self.eager_share,
            self.window,
            "; ".join(parts),
        )
        self.warnings += 1
        self._window_warned = True

    # -- reading ----------------------------------------------------------------------------------------------------

    def track_buckets(self, bucket_by_size: Sequence[int | None], tokens_per_size: int = 1) -> None:
        """Count replays for a runner whose batch of size ``n`` replays bucket ``bucket_by_size[n]`` and carries
        ``n * tokens_per_size`` tokens (a verify runner's sizes count requests of ``query_len`` tokens each).

        A second runner of the same buckets keeps counting into the same rows; one of other buckets needs its own
        ``ReplayMetrics`` once replays were counted (their rows would no longer add up)."""
        mapping = tuple(bucket_by_size)
        self.tokens_per_size = tokens_per_size
        if mapping == self.bucket_by_size:
            return
        if any(self.replays_by_size):
            raise ValueError(
                f"these {self.phase} metrics already counted replays of buckets {self.buckets}; a runner of buckets "
                f"{sorted({bucket for bucket in mapping if bucket is not None})} needs a ReplayMetrics of its own"
            )
        self.bucket_by_size = mapping
        self.replays_by_size = [0] * len(mapping)

    @property
    def buckets(self) -> list[int]:
        """The buckets replays are counted for, ascending."""
        return sorted({bucket for bucket in self.bucket_by_size if bucket is not None})

    @property
    def replays(self) -> int:
        """Steps that replayed a graph."""
        return sum(self.replays_by_size)

    @property
    def eager(self) -> int:
        """Steps that ran eagerly, whatever the reason."""
        return sum(self.eager_steps)

    @property
    def steps(self) -> int:
        """Every step counted."""
        return self.replays + self.eager

    def eager_count(self, reason: EagerReason) -> int:
        """Steps that ran eagerly for ``reason``."""
        return self.eager_steps[_INDEX[reason]]

    def bucket_rows(self) -> list[BucketRow]:
        """One row per bucket, ascending (buckets that never replayed included)."""
        totals = {bucket: [0, 0, 0] for bucket in self.buckets}
        for size, (bucket, count) in enumerate(zip(self.bucket_by_size, self.replays_by_size, strict=True)):
            if bucket is not None and count:
                row = totals[bucket]
                row[0] += count
                row[1] += size * count * self.tokens_per_size
                row[2] += (bucket - size) * count * self.tokens_per_size
        return [BucketRow(bucket, *row) for bucket, row in totals.items()]

    def eager_rows(self) -> list[EagerRow]:
        """One row per reason that sent a step eager, in ``EagerReason`` order."""
        return [
            EagerRow(reason, steps, tokens, reason.hint(self.phase))
            for reason, steps, tokens in zip(_REASONS, self.eager_steps, self.eager_tokens, strict=True)
            if steps
        ]

    def to_dict(self) -> dict[str, Any]:
        """Everything, JSON-ready."""
        return {
            "phase": str(self.phase),
            "steps": self.steps,
            "replays": self.replays,
            "eager": self.eager,
            "buckets": [row.as_dict() for row in self.bucket_rows()],
            "eager_reasons": [row.as_dict() for row in self.eager_rows()],
            "window": self.window,
            "warnings": self.warnings,
            "lazy_captures": self.lazy_captures,
            "lazy_capture_seconds": round(self.lazy_capture_seconds, 6),
        }

    def table(self) -> str:
        """Plain text: a summary line, the bucket rows, then the eager reasons with their counts."""
        lines = [f"{self.label} CUDA graphs: steps {self.steps}, replayed {self.replays}, eager {self.eager}"]
        if self.lazy_captures:
            lines[0] += f", captured on first use {self.lazy_captures} ({1000 * self.lazy_capture_seconds:.1f} ms)"
        bucket_rows = self.bucket_rows()
        if bucket_rows:
            header: tuple[str, ...] = ("bucket", "replays", "real tokens", "padded tokens", "padding %")
            cells: list[tuple[str, ...]] = [
                (str(r.bucket), str(r.replays), str(r.real_tokens), str(r.padded_tokens), f"{r.padding_percent:.1f}")
                for r in bucket_rows
            ]
            lines += _aligned(header, cells, left=frozenset())
        eager_rows = self.eager_rows()
        if eager_rows:
            header = ("eager reason", "steps", "tokens", "what would capture them")
            cells = [(r.reason.text, str(r.steps), str(r.tokens), r.hint or "") for r in eager_rows]
            lines += _aligned(header, cells, left=frozenset({0, 3}))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"ReplayMetrics({self.phase}, steps={self.steps}, replays={self.replays}, eager={self.eager})"


def _aligned(header: tuple[str, ...], rows: list[tuple[str, ...]], left: frozenset[int]) -> list[str]:
    """``header`` and ``rows`` as ``|``-separated lines, each column as wide as its widest cell: the columns in
    ``left`` (text) left-aligned, the others (numbers) right-aligned."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: tuple[str, ...]) -> str:
        padded = [
            cell.ljust(width) if index in left else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        return " | ".join(padded).rstrip()

    return [line(header), *(line(row) for row in rows)]
