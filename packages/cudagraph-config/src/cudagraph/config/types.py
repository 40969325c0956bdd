"""The resolved CUDA-graph configuration: one ``PhaseConfig`` per phase plus the global switches.

Pure data plus its renderings (``to_dict``, ``explain``, ``to_cli_args``); nothing here parses flags or applies rules
(see ``resolve``). The phase and backend vocabulary lives in ``vocabulary`` and is re-exported here. Never imports
torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from .buckets import default_buckets
from .flags import (
    BUCKETS_OPTIONS,
    COMPILER_OPTION,
    MAX_SIZE_OPTIONS,
    MODE_OPTION,
    SWITCH_OPTIONS,
    TORCH_COMPILE_MODE_OPTION,
    TORCH_COMPILE_OPTION,
)
from .memory_budget import MemoryBudget
from .vocabulary import (
    ALLOWED_BACKENDS_PER_PHASE,
    DEFAULT_CUDA_GRAPH_MODE,
    TC_PIECEWISE_COMPILERS,
    WHAT_EACH_BACKEND_CAPTURES,
    Backend,
    ConfigError,
    Phase,
    phase_key,
)

__all__ = [
    "ALLOWED_BACKENDS_PER_PHASE",
    "DEFAULT_CUDA_GRAPH_MODE",
    "Backend",
    "ConfigError",
    "CudaGraphConfig",
    "Phase",
    "PhaseConfig",
]

_EXPLAIN_LIST_LIMIT = 12


@dataclass(frozen=True)
class PhaseConfig:
    """The resolved settings of one phase: its backend and the shapes (batch sizes or token counts) to capture."""

    backend: Backend
    buckets: tuple[int, ...]
    """Ascending, deduplicated shapes to capture; empty when the backend is ``disabled``."""
    max_size: int
    """The largest shape this phase is sized for: the last bucket, or the max the user gave alongside an explicit
    bucket list; 0 when the backend is ``disabled``."""
    max_padding_ratio: float | None = None
    """A batch whose bucket is more than this multiple of its real size runs eagerly (``None``: any padding
    replays)."""
    memory_budget: MemoryBudget | None = None
    """The most device memory this phase's graphs may take; capture stops before exceeding it (``None``: no cap)."""

    @property
    def enabled(self) -> bool:
        """Whether this phase replays graphs at all."""
        return self.backend is not Backend.DISABLED


def _format_value(value: object) -> str:
    if isinstance(value, tuple):
        if not value:
            return "(none)"
        shown = [str(item) for item in value]
        if len(shown) > _EXPLAIN_LIST_LIMIT:
            shown = [*shown[:6], "...", *shown[-3:]]
        return " ".join(shown) + f" ({len(value)})"
    return str(value)


@dataclass(frozen=True)
class CudaGraphConfig:
    """The one resolved CUDA-graph configuration of an engine, per phase, with where every value came from.

    ``sources`` maps a dotted key (``"decode.backend"``, ``"prefill.buckets"``, ``"debug"``...) to a human-readable
    origin; it is excluded from equality so that configs reached by different routes compare equal.
    """

    decode: PhaseConfig
    prefill: PhaseConfig
    tc_piecewise_compiler: str = "eager"
    torch_compile_max_bs: int = 0
    """Full decode graphs of batch sizes up to this capture an inductor-compiled forward (0: none)."""
    torch_compile_mode: str | None = None
    """``torch.compile`` mode of every inductor-compiled forward (one of ``TORCH_COMPILE_MODES``; ``None``: inductor's
    defaults). Used by the compiled buckets of full decode graphs and by tc_piecewise's inductor pieces; kept, and
    marked unused in ``sources``, when nothing compiles."""
    debug: bool = False
    enable_gc: bool = False
    disable_padding: bool = False
    profile_capture: bool = False
    """Record a torch.profiler trace of one capture (``--enable-profile-cuda-graph``); the runner logs its path."""
    compile_cache_dir: str | None = None
    """Where inductor keeps its FX-graph and autotune caches for compiled pieces (``None``: inductor's default)."""
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def for_phase(self, phase: Phase | str) -> PhaseConfig:
        """The settings of ``phase``."""
        return self.decode if Phase(phase) is Phase.DECODE else self.prefill

    def backend(self, phase: Phase | str) -> Backend:
        """The backend of ``phase``."""
        return self.for_phase(phase).backend

    def values(self) -> dict[str, object]:
        """Every value by its ``sources`` key, in display order."""
        values: dict[str, object] = {}
        for phase in Phase:
            phase_config = self.for_phase(phase)
            values[phase_key(phase, "backend")] = phase_config.backend.value
            values[phase_key(phase, "buckets")] = phase_config.buckets
            values[phase_key(phase, "max_size")] = phase_config.max_size
        values["tc_piecewise_compiler"] = self.tc_piecewise_compiler
        values["torch_compile_max_bs"] = self.torch_compile_max_bs
        values["torch_compile_mode"] = self.torch_compile_mode
        for switch in SWITCH_OPTIONS:
            values[switch] = getattr(self, switch)
        return values

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict: ``decode`` and ``prefill`` hold the backend names, the rest sits alongside.

        Keys: ``decode``, ``decode_buckets``, ``decode_max_size``, the same for ``prefill``, ``tc_piecewise_compiler``,
        ``torch_compile_max_bs``, ``torch_compile_mode`` (``None``: inductor's defaults), ``debug``, ``enable_gc``,
        ``disable_padding``, ``profile_capture`` and ``sources``.
        """
        result: dict[str, object] = {}
        for phase in Phase:
            phase_config = self.for_phase(phase)
            result[phase.value] = phase_config.backend.value
            result[f"{phase.value}_buckets"] = list(phase_config.buckets)
            result[f"{phase.value}_max_size"] = phase_config.max_size
        result["tc_piecewise_compiler"] = self.tc_piecewise_compiler
        result["torch_compile_max_bs"] = self.torch_compile_max_bs
        result["torch_compile_mode"] = self.torch_compile_mode
        for switch in SWITCH_OPTIONS:
            result[switch] = getattr(self, switch)
        result["sources"] = dict(self.sources)
        return result

    def explain(self) -> str:
        """One line per value: key, value, and where it came from (JSON, flag, legacy flag, default or rule); then
        one ``<phase>.captures`` line per phase saying what its backend's graphs hold."""
        rows = [
            (key, _format_value(value), self.sources.get(key, "not recorded")) for key, value in self.values().items()
        ]
        key_width = max(len(key) for key, _, _ in rows)
        value_width = max(len(value) for _, value, _ in rows)
        lines = [f"{key:<{key_width}}  {value:<{value_width}}  {source}" for key, value, source in rows]
        for phase in Phase:
            captures = WHAT_EACH_BACKEND_CAPTURES[phase][self.backend(phase)]
            lines.append(f"{phase_key(phase, 'captures'):<{key_width}}  {captures}")
        return "\n".join(lines)

    def to_cli_args(self) -> list[str]:
        """Flags that resolve back to an equal config in any environment.

        The backends go into ``--cuda-graph-mode``, which locks them against compatibility rules; buckets are spelled
        out unless they are the default schedule of their max, in which case the max alone says it.

        Example:
            >>> from cudagraph.config import resolve
            >>> resolve(decode_cuda_graph_max_bs=16, prefill_disable_cuda_graph=True).to_cli_args()
            ['--cuda-graph-mode', '{"decode": "full", "prefill": "disabled"}', '--decode-cuda-graph-max-bs', '16']
        """
        args = [MODE_OPTION, json.dumps({phase.value: self.backend(phase).value for phase in Phase})]
        for phase in Phase:
            phase_config = self.for_phase(phase)
            if not phase_config.enabled:
                continue
            buckets, max_size = phase_config.buckets, phase_config.max_size
            if not buckets:
                raise ConfigError(f"{phase}: backend {phase_config.backend} with no buckets cannot be written as flags")
            if max_size == buckets[-1] and buckets == default_buckets(phase, max_size):
                args += [MAX_SIZE_OPTIONS[phase], str(max_size)]
                continue
            args += [BUCKETS_OPTIONS[phase], *(str(size) for size in buckets)]
            if max_size != buckets[-1]:
                args += [MAX_SIZE_OPTIONS[phase], str(max_size)]
        if self.tc_piecewise_compiler != TC_PIECEWISE_COMPILERS[0]:
            args += [COMPILER_OPTION, self.tc_piecewise_compiler]
        if self.torch_compile_max_bs:
            args += [TORCH_COMPILE_OPTION, str(self.torch_compile_max_bs)]
        if self.torch_compile_mode is not None:
            args += [TORCH_COMPILE_MODE_OPTION, self.torch_compile_mode]
        args += [option for switch, option in SWITCH_OPTIONS.items() if getattr(self, switch)]
        return args
