"""The vocabulary of CUDA-graph configuration: phases, backends, errors and the resolved config dataclasses.

Pure data: nothing here parses flags or applies rules (see ``resolve``). Never imports torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


class Phase(str, enum.Enum):
    """A forward phase that can be graphed: decode steps keyed by batch size, prefill keyed by token count."""

    DECODE = "decode"
    PREFILL = "prefill"

    def __str__(self) -> str:
        return self.value


class Backend(str, enum.Enum):
    """How a phase is captured and replayed (``disabled``: always eager)."""

    FULL = "full"
    BREAKABLE = "breakable"
    TC_PIECEWISE = "tc_piecewise"
    DISABLED = "disabled"

    def __str__(self) -> str:
        return self.value


DEFAULT_CUDA_GRAPH_MODE: Mapping[Phase, Backend] = MappingProxyType(
    {Phase.DECODE: Backend.FULL, Phase.PREFILL: Backend.BREAKABLE}
)
"""Decode replays one full graph; prefill graphs everything but attention."""

ALLOWED_BACKENDS_PER_PHASE: Mapping[Phase, frozenset[Backend]] = MappingProxyType(
    {
        Phase.DECODE: frozenset(Backend),
        # Prefill attention depends on per-request extend lengths, which one static graph cannot hold.
        Phase.PREFILL: frozenset({Backend.BREAKABLE, Backend.TC_PIECEWISE, Backend.DISABLED}),
    }
)


class ConfigError(ValueError):
    """Bad CUDA-graph configuration input: the message names the flag or key, the value, and what is allowed."""


@dataclass(frozen=True)
class PhaseConfig:
    """The resolved settings of one phase: its backend and the shapes (batch sizes or token counts) to capture."""

    backend: Backend
    buckets: tuple[int, ...]
    """Ascending, deduplicated shapes to capture; empty when the backend is ``disabled``."""
    max_size: int
    """The largest shape this phase may replay (batch size for decode, token count for prefill)."""

    @property
    def enabled(self) -> bool:
        """Whether this phase replays graphs at all."""
        return self.backend is not Backend.DISABLED


@dataclass(frozen=True)
class CudaGraphConfig:
    """The one resolved CUDA-graph configuration of an engine, per phase, with where every value came from.

    ``sources`` maps a dotted key (``"decode.backend"``, ``"prefill.buckets"``, ``"debug"``...) to a human-readable
    origin; it is excluded from equality so that configs reached by different routes compare equal.
    """

    decode: PhaseConfig
    prefill: PhaseConfig
    tc_piecewise_compiler: str = "eager"
    debug: bool = False
    enable_gc: bool = False
    disable_padding: bool = False
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def for_phase(self, phase: Phase | str) -> PhaseConfig:
        """The settings of ``phase``."""
        return self.decode if Phase(phase) is Phase.DECODE else self.prefill

    def backend(self, phase: Phase | str) -> Backend:
        """The backend of ``phase``."""
        return self.for_phase(phase).backend
