"""What a capture cost: graphs, seconds and device bytes, in total and per shape."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ShapeCaptureStats:
    """The cost of capturing one shape (warmup runs included)."""

    shape: int
    seconds: float
    bytes: int
    """Device memory that left the free pool while this shape was captured (shared-pool growth, not its size)."""


@dataclass
class CaptureStats:
    """The cost of one runner's capture: totals and every shape in capture order (largest first)."""

    graphs: int = 0
    seconds: float = 0.0
    bytes: int = 0
    per_shape: list[ShapeCaptureStats] = field(default_factory=list)

    def record(self, shape_stats: ShapeCaptureStats) -> None:
        """Add one captured shape to the totals."""
        self.per_shape.append(shape_stats)
        self.graphs += 1
        self.seconds += shape_stats.seconds
        self.bytes += shape_stats.bytes

    def summary(self) -> str:
        """One line for the log: how many graphs, how long, how much memory."""
        return f"{self.graphs} graphs in {self.seconds:.2f} s, {self.bytes / 2**30:.3f} GiB"
