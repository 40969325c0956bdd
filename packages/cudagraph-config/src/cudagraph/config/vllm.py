"""vLLM's CUDA-graph spellings: ``--cudagraph-mode`` names, ``--enforce-eager`` and ``--compilation-config`` JSON.

Each vLLM mode name stands for one backend per phase (``VLLM_CUDAGRAPH_MODES``, the design card's table). The readers
here turn these spellings into claims like every other flag's; ``flags`` places them on the ladder at the level of the
per-phase flags. Of vLLM's compilation config only the CUDA-graph keys are read (``COMPILATION_CONFIG_KEYS``); the
rest of vLLM's fields (``VLLM_COMPILATION_CONFIG_FIELDS``) belong to vLLM and are skipped with a debug log, and a key
that is neither (a typo) is skipped with a warning naming the closest known key. Never imports torch.
"""

from __future__ import annotations

import difflib
import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .values import Claims, Notes, json_type, read_json_object, read_positive_int, read_sizes, read_switch
from .vocabulary import ALLOWED_BACKENDS_PER_PHASE, Backend, ConfigError, Phase, allowed_backends, phase_key

logger = logging.getLogger("cudagraph.config")

VLLM_CUDAGRAPH_MODES: Mapping[str, Mapping[Phase, Backend]] = MappingProxyType(
    {
        "NONE": MappingProxyType({Phase.DECODE: Backend.DISABLED, Phase.PREFILL: Backend.DISABLED}),
        "PIECEWISE": MappingProxyType({Phase.DECODE: Backend.TC_PIECEWISE, Phase.PREFILL: Backend.TC_PIECEWISE}),
        "FULL": MappingProxyType({Phase.DECODE: Backend.FULL, Phase.PREFILL: Backend.FULL}),
        "FULL_DECODE_ONLY": MappingProxyType({Phase.DECODE: Backend.FULL, Phase.PREFILL: Backend.DISABLED}),
        "FULL_AND_PIECEWISE": MappingProxyType({Phase.DECODE: Backend.FULL, Phase.PREFILL: Backend.TC_PIECEWISE}),
    }
)
"""vLLM's ``CUDAGraphMode`` names -> the backend of each phase (names are read case-insensitively).

A name whose backends a phase does not allow (``ALLOWED_BACKENDS_PER_PHASE``) is refused, naming the ones that work."""

COMPILATION_CONFIG_EXAMPLE = '{"cudagraph_mode": "FULL_AND_PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4, 8]}'


def allowed_vllm_modes() -> tuple[str, ...]:
    """The mode names whose backends every phase allows, in table order (for messages and help texts)."""
    return tuple(
        name
        for name, mode in VLLM_CUDAGRAPH_MODES.items()
        if all(backend in ALLOWED_BACKENDS_PER_PHASE[phase] for phase, backend in mode.items())
    )


def read_vllm_mode(label: str, raw: object, notes: Notes) -> Claims:
    """A vLLM mode name (any case, or a vLLM ``CUDAGraphMode`` member) as the backend claims of both phases."""
    name = raw.name if isinstance(raw, enum.Enum) else raw
    allowed = ", ".join(allowed_vllm_modes())
    if not isinstance(name, str) or name.upper() not in VLLM_CUDAGRAPH_MODES:
        hint = "; a per-phase JSON object goes to --cuda-graph-mode" if str(name).lstrip().startswith("{") else ""
        raise ConfigError(f"{label}: unknown vLLM CUDA-graph mode {raw!r}; allowed: {allowed}{hint}")
    mode = VLLM_CUDAGRAPH_MODES[name.upper()]
    for phase, backend in mode.items():
        if backend not in ALLOWED_BACKENDS_PER_PHASE[phase]:
            raise ConfigError(
                f"{label}: {name.upper()} sets {phase} to {backend.value!r}, which {phase} does not allow "
                f"(allowed for {phase}: {', '.join(b.value for b in allowed_backends(phase))}); allowed: {allowed}"
            )
    return {phase_key(phase, "backend"): backend for phase, backend in mode.items()}


def read_enforce_eager(label: str, raw: object, notes: Notes) -> Claims:
    """``--enforce-eager``: both phases run eagerly."""
    read_switch(label, raw)
    return {phase_key(phase, "backend"): Backend.DISABLED for phase in Phase}


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class CompilationConfigKey:
    """One CUDA-graph key of vLLM's compilation config: the JSON type it must have, and how its value is read."""

    key: str
    expected: str
    """The allowed type, for messages (``"an array of integers"``)."""
    has_type: Callable[[object], bool]
    read: Callable[[str, object, Notes], Claims]


COMPILATION_CONFIG_KEYS: tuple[CompilationConfigKey, ...] = (
    CompilationConfigKey(
        "cudagraph_mode",
        f"a mode name string ({', '.join(VLLM_CUDAGRAPH_MODES)})",
        lambda value: isinstance(value, str),
        read_vllm_mode,
    ),
    CompilationConfigKey(
        "cudagraph_capture_sizes",
        "an array of integers",
        lambda value: isinstance(value, list) and all(_is_integer(item) for item in value),
        lambda label, raw, notes: {phase_key(Phase.DECODE, "buckets"): read_sizes(label, raw)},
    ),
    CompilationConfigKey(
        "max_cudagraph_capture_size",
        "an integer",
        _is_integer,
        lambda label, raw, notes: {phase_key(Phase.DECODE, "max_size"): read_positive_int(label, raw)},
    ),
)
"""The keys of ``--compilation-config`` that are read; a ``null`` value counts as not given (vLLM's default)."""


# The init fields of vLLM's ``CompilationConfig`` (vllm/config/compilation.py, vLLM 0.13.0 development line at
# commit 002284db4c87): the keys vLLM's ``--compilation-config`` accepts. Fields declared ``init=False``
# (``local_cache_dir``, ``enabled_custom_ops``, ...) are vLLM's runtime state and not accepted, so not listed.
VLLM_COMPILATION_CONFIG_FIELDS: frozenset[str] = frozenset(
    {
        "level",
        "mode",
        "debug_dump_path",
        "cache_dir",
        "compile_cache_save_format",
        "backend",
        "custom_ops",
        "splitting_ops",
        "compile_mm_encoder",
        "compile_sizes",
        "compile_ranges_split_points",
        "inductor_compile_config",
        "inductor_passes",
        "cudagraph_mode",
        "cudagraph_num_of_warmups",
        "cudagraph_capture_sizes",
        "cudagraph_copy_inputs",
        "cudagraph_specialize_lora",
        "use_inductor_graph_partition",
        "pass_config",
        "max_cudagraph_capture_size",
        "dynamic_shapes_config",
    }
)
"""The keys of vLLM's compilation config that are vLLM's own: passed over without a warning."""


def unknown_key_message(label: str, key: str) -> str:
    """The warning for a ``--compilation-config`` key that is neither ours nor vLLM's, naming the closest known key.

    Example:
        >>> unknown_key_message("--compilation-config", "cudagraph_mod")  # doctest: +ELLIPSIS
        "--compilation-config: unknown key 'cudagraph_mod' ignored (...); did you mean 'cudagraph_mode'?"
    """
    ours = [row.key for row in COMPILATION_CONFIG_KEYS]
    close = difflib.get_close_matches(key, [*ours, *sorted(VLLM_COMPILATION_CONFIG_FIELDS - set(ours))], n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"the CUDA-graph keys are {', '.join(ours)}"
    return (
        f"{label}: unknown key {key!r} ignored (neither a CUDA-graph key nor a field of vLLM's CompilationConfig); "
        f"{hint}"
    )


def read_compilation_config(label: str, raw: object, notes: Notes) -> Claims:
    """vLLM's ``--compilation-config`` (JSON text, or a mapping from Python): the claims of its CUDA-graph keys."""
    parsed = read_json_object(
        label, raw, what="vLLM's compilation config as a JSON object", entry="key", example=COMPILATION_CONFIG_EXAMPLE
    )
    known = {row.key: row for row in COMPILATION_CONFIG_KEYS}
    claims: Claims = {}
    for key, value in parsed.items():
        row = known.get(key)
        if row is None and key in VLLM_COMPILATION_CONFIG_FIELDS:
            logger.debug("%s: %r is not a CUDA-graph setting; left to vLLM", label, key)
            continue
        if row is None:
            logger.warning(unknown_key_message(label, key))
            continue
        if value is None:
            continue
        if not row.has_type(value):
            raise ConfigError(f"{label}: {key} must be {row.expected}, got {json_type(value)} {value!r}")
        claims.update(row.read(f"{label} {key}", value, notes))
    return claims
