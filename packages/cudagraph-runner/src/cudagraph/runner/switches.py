"""The few engine-wide settings a runner reads besides its own phase's ``PhaseConfig``, chosen once, at the boundary.

A runner is handed a ``RunnerConfig``: its phase's ``PhaseConfig`` and a ``RunnerSwitches``. Given a whole
``CudaGraphConfig`` instead (``DecodeCudaGraphRunner(model_runner, config)``, the contract engines build with), it
selects both from it once (``runner_config``) and reads the config no more; given a bare ``PhaseConfig``, the
switches are the defaults.
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


@dataclass(frozen=True)
class RunnerConfig:
    """What one runner is built with: its phase's ``PhaseConfig`` and the engine-wide switches it reads.

    Example (an engine's builder)::

        DecodeCudaGraphRunner(model_runner, RunnerConfig.of(config, Phase.DECODE))
    """

    phase: PhaseConfig
    switches: RunnerSwitches = RunnerSwitches()

    @classmethod
    def of(cls, config: CudaGraphConfig, phase: Phase) -> RunnerConfig:
        """``phase``'s settings in ``config`` and the switches a ``phase`` runner reads of it."""
        return cls(config.for_phase(phase), RunnerSwitches.of(config, phase))


def runner_config(config: CudaGraphConfig | PhaseConfig | RunnerConfig, phase: Phase) -> RunnerConfig:
    """What a ``phase`` runner is built with, from any of the forms its constructor takes: a whole
    ``CudaGraphConfig`` (selected once, here), a ``PhaseConfig`` (default switches) or a ``RunnerConfig``."""
    if isinstance(config, RunnerConfig):
        return config
    if isinstance(config, CudaGraphConfig):
        return RunnerConfig.of(config, phase)
    if isinstance(config, PhaseConfig):
        return RunnerConfig(config)
    raise TypeError(
        f"a {phase} runner takes a CudaGraphConfig, its phase's PhaseConfig or a RunnerConfig, "
        f"got {type(config).__name__}"
    )
