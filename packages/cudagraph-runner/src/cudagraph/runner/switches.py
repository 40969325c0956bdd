"""The few engine-wide settings a runner reads besides its own phase's ``PhaseConfig``, chosen once, at the boundary.

A runner is handed its phase's ``PhaseConfig`` and a ``RunnerSwitches``; given a whole ``CudaGraphConfig`` instead
(``DecodeCudaGraphRunner(model_runner, config)``, the contract engines build with), it selects both from it once
(``phase_settings``) and reads the config no more.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from cudagraph.config import CudaGraphConfig, Phase, PhaseConfig


@dataclass(frozen=True)
class RunnerSwitches:
    """Engine-wide switches of a ``CudaGraphConfig`` that change how one runner captures and replays."""

    disable_padding: bool = False
    """Only exact buckets replay (every other size runs eagerly)."""
    debug: bool = False
    """Check the static buffers' and the graph-read tensors' addresses before every replay."""
    enable_gc: bool = False
    """Leave the garbage collector running during capture (frozen by default)."""
    profile_capture: bool = False
    """Capture the largest bucket under torch.profiler and keep the trace."""
    tc_piecewise_compiler: str = "eager"
    """What compiles the pieces of a ``tc_piecewise`` backend (``eager`` or ``inductor``)."""
    compile_max_size: int = 0
    """Full graphs of buckets up to this capture an inductor-compiled forward (decode's ``torch_compile_max_bs``;
    0 for prefill)."""
    torch_compile_mode: str | None = None
    """``torch.compile`` mode of every inductor-compiled forward."""
    compile_cache_dir: str | None = None
    """Where inductor keeps its caches for compiled pieces."""

    @classmethod
    def of(cls, config: CudaGraphConfig, phase: Phase) -> RunnerSwitches:
        """The switches of ``config`` that a ``phase`` runner reads."""
        shared = {name: getattr(config, name) for name in _SAME_NAMED}
        # SGLang's --torch-compile-max-bs: compiled small batch sizes, decode only.
        return cls(compile_max_size=config.torch_compile_max_bs if phase is Phase.DECODE else 0, **shared)


_SAME_NAMED = tuple(field.name for field in fields(RunnerSwitches) if field.name != "compile_max_size")
"""The switches named as the ``CudaGraphConfig`` fields they are read from."""


def phase_settings(
    config: CudaGraphConfig | PhaseConfig, phase: Phase, switches: RunnerSwitches | None = None
) -> tuple[PhaseConfig, RunnerSwitches]:
    """A ``phase`` runner's ``PhaseConfig`` and switches: selected from a whole ``CudaGraphConfig`` (its switches
    unless ``switches`` are given), or ``config`` itself with ``switches`` (default: ``RunnerSwitches()``)."""
    if isinstance(config, CudaGraphConfig):
        return config.for_phase(phase), switches if switches is not None else RunnerSwitches.of(config, phase)
    if isinstance(config, PhaseConfig):
        return config, switches if switches is not None else RunnerSwitches()
    raise TypeError(f"a {phase} runner takes a CudaGraphConfig or its phase's PhaseConfig, got {type(config).__name__}")
