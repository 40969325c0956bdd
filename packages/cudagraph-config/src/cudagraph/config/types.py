"""The resolved CUDA-graph configuration: one ``PhaseConfig`` per phase plus the global switches.

Pure data plus its renderings as data and text (``to_dict``, ``explain``); nothing here parses or writes flags (the
table is ``flags``'s; ``to_cli_args`` only calls ``cli_args``, which sits beside it) or applies rules (see
``resolve``). ``PhaseConfig`` lives in ``phase_config`` and the phase and backend vocabulary in ``vocabulary``, both
re-exported here; the account of a bucket grid that ``explain`` ends with is ``grid``'s. Never imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .cli_args import config_cli_args
from .grid import MAX_APPENDED_NOTE, explain_grid
from .phase_config import PHASE_FIELDS, PhaseConfig
from .vocabulary import (
    ALLOWED_BACKENDS_PER_PHASE,
    DEFAULT_CUDA_GRAPH_MODE,
    STEPS_EACH_PHASE_GRAPHS,
    SWITCH_OPTIONS,
    WHAT_EACH_BACKEND_CAPTURES,
    WHAT_EACH_CAPTURE_POLICY_DOES,
    Backend,
    CapturePolicy,
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


def _format_value(value: object) -> str:
    if isinstance(value, tuple):
        if not value:
            return "(none)"
        shown = [str(item) for item in value]
        if len(shown) > _EXPLAIN_LIST_LIMIT:
            shown = [*shown[:6], "...", *shown[-3:]]
        return " ".join(shown) + f" ({len(value)})"
    return str(value)


ENGINE_WIDE_FIELDS: tuple[str, ...] = (
    "tc_piecewise_compiler",
    "torch_compile_max_bs",
    "torch_compile_mode",
    "compile_cache_dir",
    *SWITCH_OPTIONS,
)
"""The ``CudaGraphConfig`` fields of no one phase, in display order (after each phase's ``PHASE_FIELDS``); each is
its own ``sources`` key."""


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

    @property
    def model_forward_compiler(self) -> str | None:
        """The compiler the model forward goes through in some graph of this config, or ``None`` when every graph
        captures the forward as written.

        ``"inductor"``: full decode graphs with compiled small buckets (``torch_compile_max_bs`` above 0), or a
        ``tc_piecewise`` phase whose pieces inductor compiles; ``"eager"``: a ``tc_piecewise`` phase with the eager
        compiler (dynamo traces and splits the forward, inductor compiles nothing). Where both apply, inductor.

        The one rule for two questions: whether dynamo traces the forward (not ``None``: an engine must then give it
        kernels dynamo can trace) and whether inductor compiles anything (``"inductor"``: ``torch_compile_mode`` and
        ``compile_cache_dir`` are used).
        """
        compiled_small_buckets = self.torch_compile_max_bs > 0 and self.decode.backend is Backend.FULL
        tc_piecewise = any(self.backend(phase) is Backend.TC_PIECEWISE for phase in Phase)
        if compiled_small_buckets or (tc_piecewise and self.tc_piecewise_compiler == "inductor"):
            return "inductor"
        return self.tc_piecewise_compiler if tc_piecewise else None

    def values(self) -> dict[str, object]:
        """Every value by its ``sources`` key, in display order: each phase's fields (``PHASE_FIELDS``), then the
        engine-wide settings."""
        values: dict[str, object] = {}
        for phase in Phase:
            phase_config = self.for_phase(phase)
            for name in PHASE_FIELDS:
                value = getattr(phase_config, name)
                values[phase_key(phase, name)] = value.value if isinstance(value, (Backend, CapturePolicy)) else value
        return values | _engine_wide_values(self)

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict: ``decode`` and ``prefill`` hold the backend names, the rest sits alongside.

        Keys: ``decode``, ``decode_buckets``, ``decode_max_size``, ``decode_max_padding_ratio`` (``None``: no limit),
        ``decode_memory_budget`` (its spelling, e.g. ``"2GiB"`` or ``"20%"``; ``None``: no cap),
        ``decode_capture_policy`` (``"eager"`` or ``"lazy"``), the same for
        ``prefill``, ``tc_piecewise_compiler``, ``torch_compile_max_bs``, ``torch_compile_mode`` (``None``: inductor's
        defaults), ``compile_cache_dir`` (``None``: inductor's own), ``debug``, ``enable_gc``, ``disable_padding``,
        ``profile_capture`` and ``sources``.
        """
        result: dict[str, object] = {}
        for phase in Phase:
            phase_config = self.for_phase(phase)
            budget = phase_config.memory_budget
            result[phase.value] = phase_config.backend.value
            result[f"{phase.value}_buckets"] = list(phase_config.buckets)
            result[f"{phase.value}_max_size"] = phase_config.max_size
            result[f"{phase.value}_max_padding_ratio"] = phase_config.max_padding_ratio
            result[f"{phase.value}_memory_budget"] = None if budget is None else str(budget)
            result[f"{phase.value}_capture_policy"] = phase_config.capture_policy.value
        return result | _engine_wide_values(self) | {"sources": dict(self.sources)}

    def explain(self) -> str:
        """One line per value: key, value, and where it came from (JSON, flag, legacy flag, default or rule); then per
        phase a ``<phase>.captures`` line saying what its backend's graphs hold, a ``<phase>.steps`` line saying which
        steps they replay (uniform steps for decode, every other step for prefill) and, for an enabled phase, a
        ``<phase>.captured`` line saying when its graphs are captured (its capture policy) and the
        ``<phase>.grid``, ``<phase>.padding`` and ``<phase>.replays`` lines of its bucket grid (see ``grid``)."""
        rows = [
            (key, _format_value(value), self.sources.get(key, "not recorded")) for key, value in self.values().items()
        ]
        notes: list[tuple[str, str]] = []
        for phase in Phase:
            notes.append((phase_key(phase, "captures"), WHAT_EACH_BACKEND_CAPTURES[phase][self.backend(phase)]))
            notes.append((phase_key(phase, "steps"), STEPS_EACH_PHASE_GRAPHS[phase]))
            if self.for_phase(phase).enabled:
                policy = self.for_phase(phase).capture_policy
                notes.append((phase_key(phase, "captured"), WHAT_EACH_CAPTURE_POLICY_DOES[policy]))
            appended = MAX_APPENDED_NOTE in self.sources.get(phase_key(phase, "buckets"), "")
            notes += explain_grid(
                phase, self.for_phase(phase), max_appended=appended, disable_padding=self.disable_padding
            )
        key_width = max(len(key) for key, _ in [*((key, value) for key, value, _ in rows), *notes])
        value_width = max(len(value) for _, value, _ in rows)
        lines = [f"{key:<{key_width}}  {value:<{value_width}}  {source}" for key, value, source in rows]
        lines += [f"{key:<{key_width}}  {text}" for key, text in notes]
        return "\n".join(lines)

    def to_cli_args(self) -> list[str]:
        """Flags that resolve back to an equal config in any environment.

        The backends go into ``--cuda-graph-mode``, which locks them against compatibility rules; buckets are spelled
        out unless they are the default schedule of their max, in which case the max alone says it. Padding ratios,
        memory budgets and the compile cache directory follow as their own flags when set. A config that no flags
        can give (an enabled phase without buckets, or whose last bucket is not its max) is a ``ConfigError``.

        Example:
            >>> from cudagraph.config import resolve
            >>> resolve(decode_cuda_graph_max_bs=16, prefill_disable_cuda_graph=True).to_cli_args()
            ['--cuda-graph-mode', '{"decode": "full", "prefill": "disabled"}', '--decode-cuda-graph-max-bs', '16']

        Written by ``cli_args.config_cli_args``, beside the flags; the method stays for its callers.
        """
        return config_cli_args(self)


def _engine_wide_values(config: CudaGraphConfig) -> dict[str, object]:
    """The settings of no one phase (``ENGINE_WIDE_FIELDS``), JSON-ready as they are."""
    return {name: getattr(config, name) for name in ENGINE_WIDE_FIELDS}
