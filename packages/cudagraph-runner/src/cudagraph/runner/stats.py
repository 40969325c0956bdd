"""What a capture cost: graphs, seconds and device bytes, in total and per shape."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ShapeCaptureStats:
    """The cost of capturing one shape (warmup runs included)."""

    shape: int
    seconds: float
    bytes: int
    """Device memory that left the free pool while this shape was captured (shared-pool growth, not its size)."""


@dataclass(frozen=True)
class CaptureStats:
    """The cost of one ``capture()`` of one runner: every shape in capture order (largest first) and the totals,
    measured once around the whole capture (a recapture after ``shutdown`` gets new stats)."""

    per_shape: tuple[ShapeCaptureStats, ...] = ()
    seconds: float = 0.0
    """Wall time of the whole capture: preparing the backend, warm-ups and every shape."""
    bytes: int = 0
    """Device memory the capture kept, as the driver sees it (pool blocks and instantiated graphs)."""
    compile_seconds: float = 0.0
    """Of ``seconds``, the time spent compiling the model forward (tc_piecewise, compiled small buckets)."""
    compilations: int = 0
    """Times the model forward was compiled (0 for a backend that compiles nothing, 1 for one graph)."""

    @property
    def graphs(self) -> int:
        """Shapes captured."""
        return len(self.per_shape)

    def summary(self) -> str:
        """One line for the log: how many graphs, how long, how much memory."""
        compiled = f" (compile {self.compile_seconds:.2f} s)" if self.compilations else ""
        return f"{self.graphs} graphs in {self.seconds:.2f} s{compiled}, {self.bytes / 2**30:.3f} GiB"
