"""What a capture cost: graphs, seconds and device bytes, in total and per bucket."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field


def warn_renamed_field(owner: str, old: str, new: str) -> None:
    """One ``DeprecationWarning`` for a field of ``owner`` read under its 0.1.0 name."""
    warnings.warn(
        f"{owner}.{old} is deprecated since cudagraph-runner 0.2.0 and will be removed in 1.0.0; use {owner}.{new}",
        DeprecationWarning,
        stacklevel=3,
    )


@dataclass(frozen=True)
class BucketCaptureStats:
    """The cost of capturing one bucket (warmup runs included)."""

    bucket: int
    seconds: float
    bytes: int
    """Device memory that left the free pool while this bucket was captured (shared-pool growth, not its size)."""

    @property
    def shape(self) -> int:
        """Deprecated name of ``bucket`` (removed in 1.0.0)."""
        warn_renamed_field("BucketCaptureStats", "shape", "bucket")
        return self.bucket


ShapeCaptureStats = BucketCaptureStats
"""Deprecated name of ``BucketCaptureStats`` (removed in 1.0.0)."""


@dataclass(frozen=True)
class CaptureStats:
    """The cost of one ``capture()`` of one runner: every bucket in capture order (largest first) and the totals,
    measured once around the whole capture (a recapture after ``shutdown`` gets new stats)."""

    per_bucket: tuple[BucketCaptureStats, ...] = ()
    seconds: float = 0.0
    """Wall time of the whole capture: preparing the backend, warm-ups and every bucket."""
    bytes: int = 0
    """Device memory the capture kept, as the driver sees it (pool blocks and instantiated graphs)."""
    compile_seconds: float = 0.0
    """Of ``seconds``, the time spent compiling the model forward (tc_piecewise, compiled small buckets)."""
    compilations: int = 0
    """Times the model forward was compiled (0 for a backend that compiles nothing, 1 for one graph)."""
    estimate_bytes: int | None = None
    """What ``estimate_capture_memory()`` predicted for the buckets this capture planned (``None``: no estimate was
    made; ``capture()`` makes one when a memory budget needs it, or reuses one asked for before)."""
    skipped: Mapping[int, str] = field(default_factory=dict)
    """Buckets left without a graph, each with why (``runner.skipped_buckets``)."""

    @property
    def graphs(self) -> int:
        """Buckets captured."""
        return len(self.per_bucket)

    @property
    def per_shape(self) -> tuple[BucketCaptureStats, ...]:
        """Deprecated name of ``per_bucket`` (removed in 1.0.0)."""
        warn_renamed_field("CaptureStats", "per_shape", "per_bucket")
        return self.per_bucket

    def summary(self) -> str:
        """One line for the log: how many graphs, how long, how much memory (and the estimate, when one was made):
        ``"9 graphs in 0.41 s, 0.092 GiB (estimate 0.088 GiB), 2 skipped"``."""
        compiled = f" (compile {self.compile_seconds:.2f} s)" if self.compilations else ""
        estimate = f" (estimate {self.estimate_bytes / 2**30:.3f} GiB)" if self.estimate_bytes is not None else ""
        skipped = f", {len(self.skipped)} skipped" if self.skipped else ""
        memory = f"{self.bytes / 2**30:.3f} GiB{estimate}"
        return f"{self.graphs} graphs in {self.seconds:.2f} s{compiled}, {memory}{skipped}"
