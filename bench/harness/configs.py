"""The configurations every section measures, as tables: one row per configuration, naming how its steps are made
(``kind``), the ``resolve()`` keywords of our runners, and whether it is ours (an error in ours fails the run; an
error in a comparison row only skips it, with the reason)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from cudagraph.config import CudaGraphConfig, resolve


class HasBackend(Protocol):
    """A measured row: its configuration's name is its ``backend``."""

    @property
    def backend(self) -> str:
        """The configuration's row label."""


class Kind(str, enum.Enum):
    """How a configuration's steps are made (one ``sources`` class each)."""

    EAGER = "eager"
    RAW = "raw"
    RUNNER = "runner"
    PRIMITIVE = "primitive"
    PEER = "peer"
    TORCH_COMPILE = "torch_compile"


class Compiles(enum.IntEnum):
    """What a configuration compiles in the bench's process, in the order rows are measured: nothing, dynamo alone
    (its tracer, eager pieces), or inductor. On the H100 a ``full`` runner replay took 64 µs of host time in a fresh
    process and 171 µs after one inductor compile in it (another probe saw no such change for a bare graph replay),
    so rows that compile are measured last, where they cannot slow a row that does not."""

    NOTHING = 0
    DYNAMO = 1
    INDUCTOR = 2


_PIECE_COMPILES: Mapping[object, Compiles] = MappingProxyType(
    {None: Compiles.NOTHING, "eager": Compiles.DYNAMO, "inductor": Compiles.INDUCTOR}
)
"""``tc_piecewise_compiler`` setting -> what the row compiles (``None``: not a tc_piecewise row)."""


@dataclass(frozen=True)
class BenchConfig:
    """One configuration: its row label, its kind, and for runners the settings ``resolve()`` reads."""

    name: str
    kind: Kind
    settings: Mapping[str, object] = field(default_factory=dict)
    peer: str | None = None
    """The peer's distribution name (``PEER`` rows)."""
    ours: bool = True
    pdl: bool | None = None
    """Whether the engine's Triton kernels launch with programmatic dependent launch while this row is captured and
    timed (``kernels.triton.pdl.use_pdl``); None: the engine's default (on where the GPU and Triton support it)."""

    @property
    def compiles(self) -> Compiles:
        """What this row compiles, read from its kind and settings: ``torch.compile`` and compiled buckets run
        inductor; ``tc_piecewise`` runs dynamo, and inductor too unless its pieces stay eager."""
        if self.kind is Kind.TORCH_COMPILE or "torch_compile_max_bs" in self.settings:
            return Compiles.INDUCTOR
        return _PIECE_COMPILES[self.settings.get("tc_piecewise_compiler")]

    def runner_config(self, phase_shapes: Mapping[str, tuple[int, ...]]) -> CudaGraphConfig:
        """The resolved config of a runner row capturing exactly ``phase_shapes`` (``decode``/``prefill`` -> shapes;
        a phase not named is disabled). ``ConfigError`` when the config rejects a setting (the row is skipped)."""
        keywords: dict[str, object] = dict(self.settings)
        for phase, shape_key, disable_key in (
            ("decode", "decode_cuda_graph_bs", "decode_disable_cuda_graph"),
            ("prefill", "prefill_cuda_graph_tokens", "prefill_disable_cuda_graph"),
        ):
            if phase in phase_shapes:
                keywords[shape_key] = list(phase_shapes[phase])
            else:
                # A phase left out is off, whatever backend the row names for it (two answers would conflict).
                keywords.pop(f"{phase}_cuda_graph_backend", None)
                keywords[disable_key] = True
        return resolve(**keywords)  # type: ignore[arg-type]  # keywords are flag names, never ``environment``


COMPILED_SMALL_BUCKETS_MAX_BS = 32
"""``--torch-compile-max-bs`` of the ``full+compiled`` row: decode buckets up to this are compiled with inductor."""

DECODE_CONFIGS: tuple[BenchConfig, ...] = (
    BenchConfig("eager", Kind.EAGER),
    BenchConfig("raw", Kind.RAW),
    BenchConfig("full", Kind.RUNNER, MappingProxyType({"decode_cuda_graph_backend": "full"})),
    BenchConfig("full/pdl-off", Kind.RUNNER, MappingProxyType({"decode_cuda_graph_backend": "full"}), pdl=False),
    BenchConfig(
        "full+compiled",
        Kind.RUNNER,
        MappingProxyType({"decode_cuda_graph_backend": "full", "torch_compile_max_bs": COMPILED_SMALL_BUCKETS_MAX_BS}),
    ),
    BenchConfig(
        "full+compiled/autotuned",
        Kind.RUNNER,
        MappingProxyType(
            {
                "decode_cuda_graph_backend": "full",
                "torch_compile_max_bs": COMPILED_SMALL_BUCKETS_MAX_BS,
                "torch_compile_mode": "max-autotune-no-cudagraphs",
            }
        ),
    ),
    BenchConfig("breakable", Kind.RUNNER, MappingProxyType({"decode_cuda_graph_backend": "breakable"})),
    BenchConfig(
        "tc_piecewise/eager",
        Kind.RUNNER,
        MappingProxyType({"decode_cuda_graph_backend": "tc_piecewise", "tc_piecewise_compiler": "eager"}),
    ),
    BenchConfig(
        "tc_piecewise/inductor",
        Kind.RUNNER,
        MappingProxyType({"decode_cuda_graph_backend": "tc_piecewise", "tc_piecewise_compiler": "inductor"}),
    ),
    BenchConfig("torch.compile", Kind.TORCH_COMPILE, ours=False),
    BenchConfig("breakable-cuda-graphs", Kind.PEER, peer="breakable-cuda-graphs", ours=False),
    BenchConfig("piecewise-cuda-graphs", Kind.PEER, peer="piecewise-cuda-graphs", ours=False),
)
"""Decode rows, in table order; ``eager`` and ``raw`` first (every ratio refers to them)."""

PREFILL_CONFIGS: tuple[BenchConfig, ...] = (
    BenchConfig("eager", Kind.EAGER),
    BenchConfig("breakable", Kind.RUNNER, MappingProxyType({"prefill_cuda_graph_backend": "breakable"})),
    BenchConfig(
        "tc_piecewise/eager",
        Kind.RUNNER,
        MappingProxyType({"prefill_cuda_graph_backend": "tc_piecewise", "tc_piecewise_compiler": "eager"}),
    ),
    BenchConfig(
        "tc_piecewise/inductor",
        Kind.RUNNER,
        MappingProxyType({"prefill_cuda_graph_backend": "tc_piecewise", "tc_piecewise_compiler": "inductor"}),
    ),
    BenchConfig("full", Kind.RUNNER, MappingProxyType({"prefill_cuda_graph_backend": "full"})),
    BenchConfig("breakable-cuda-graphs", Kind.PEER, peer="breakable-cuda-graphs", ours=False),
    BenchConfig("piecewise-cuda-graphs", Kind.PEER, peer="piecewise-cuda-graphs", ours=False),
)
"""Prefill rows (``full`` only where the config allows prefill ``full``; skipped with its reason otherwise)."""

REFERENCE_CONFIGS = frozenset({"eager", "raw"})
"""Rows every ratio of their section refers to: measured whatever ``--configs`` selects."""


def measurement_order(configs: tuple[BenchConfig, ...]) -> tuple[BenchConfig, ...]:
    """``configs`` in the order a section measures them: those that compile nothing first, then dynamo's, then
    inductor's (table order kept within each group), so no row's host time is taken in a process slowed by an
    earlier row's compile."""
    return tuple(sorted(configs, key=lambda config: config.compiles))


def table_position(configs: tuple[BenchConfig, ...]) -> Callable[[HasBackend], int]:
    """A sort key putting rows (anything with a ``backend`` row label) back into the table order of ``configs``."""
    position = {config.name: index for index, config in enumerate(configs)}
    return lambda row: position[row.backend]


def selectable_config_names() -> tuple[str, ...]:
    """The names ``--configs`` accepts: every decode and prefill row, in table order."""
    return tuple(dict.fromkeys(config.name for config in (*DECODE_CONFIGS, *PREFILL_CONFIGS)))


def select_configs(configs: tuple[BenchConfig, ...], names: frozenset[str] | None) -> tuple[BenchConfig, ...]:
    """The rows of ``configs`` named in ``names`` (all of them for ``None``), with the reference rows kept."""
    if names is None:
        return configs
    return tuple(config for config in configs if config.name in names or config.name in REFERENCE_CONFIGS)


BREAK_IMPLEMENTATIONS: tuple[BenchConfig, ...] = (
    BenchConfig("ours", Kind.PRIMITIVE),
    BenchConfig("breakable-cuda-graphs", Kind.PEER, peer="breakable-cuda-graphs", ours=False),
    BenchConfig("piecewise-cuda-graphs", Kind.PEER, peer="piecewise-cuda-graphs", ours=False),
)
"""The breakable implementations the breaks section compares."""


def _row(configs: tuple[BenchConfig, ...], name: str) -> BenchConfig:
    return next(config for config in configs if config.name == name)


CAPTURE_BACKENDS: tuple[tuple[str, BenchConfig], ...] = (
    *(
        ("decode", _row(DECODE_CONFIGS, name))
        for name in ("full", "full+compiled", "full+compiled/autotuned", "breakable", "tc_piecewise/eager")
    ),
    ("prefill", _row(PREFILL_CONFIGS, "breakable")),
    ("prefill", _row(PREFILL_CONFIGS, "tc_piecewise/eager")),
)
"""(phase, runner row) whose capture of the phase's default buckets the capture section measures."""


def default_shapes(phase: str, max_size: int) -> tuple[int, ...]:
    """The default buckets of ``phase`` up to ``max_size`` (what an engine captures when the user says nothing)."""
    key = "decode_cuda_graph_max_bs" if phase == "decode" else "prefill_cuda_graph_max_tokens"
    return resolve(**{key: max_size}).for_phase(phase).buckets  # type: ignore[arg-type]
