"""Readers that turn one raw flag or keyword value into a typed value, or raise a ``ConfigError``.

Command lines deliver strings, Python callers deliver ints, lists and enums: every reader accepts both, so the two
routes resolve to the same config and fail with the same message. Each message names the flag, the bad value and
what is allowed.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .legacy_values import LEGACY_BACKEND_VALUES
from .vocabulary import (
    CUDA_GRAPH_COMPILE_MODES,
    TC_PIECEWISE_COMPILERS,
    TORCH_COMPILE_MODES,
    Backend,
    CapturePolicy,
    ConfigError,
    LegacyFlagWarning,
    Phase,
    allowed_backends,
    phase_key,
)

MODE_EXAMPLE = '{"decode": "full", "prefill": "breakable"}'

Claims = dict[str, object]
"""Settings key (``"decode.backend"``, ``"debug"``...) -> typed value, as stated by one flag."""


@dataclass(frozen=True)
class LegacyValueUse:
    """A deprecated value spelling met while reading a flag: the flag, the settings key it decided, the spelling."""

    label: str
    key: str
    spelling: str


Notes = list[LegacyValueUse]
"""Where a reader records the legacy value spellings it accepted, for ``resolve`` to warn about and explain."""


def _names(values: Sequence[object]) -> str:
    return ", ".join(str(value) for value in values)


def read_phase(label: str, raw: object) -> Phase:
    """``raw`` as a ``Phase``."""
    try:
        return Phase(raw)
    except ValueError:
        raise ConfigError(f"{label}: unknown phase {raw!r}; allowed phases: {_names(list(Phase))}") from None


def backend_for_phase(label: str, raw: object, phase: Phase) -> Backend:
    """``raw`` (a ``Backend`` or its value) as a backend ``phase`` allows, for callers outside ``resolve``.

    A legacy spelling (``"tcpcg"``) reads as its backend with one ``LegacyFlagWarning`` at the caller; anything
    else unknown, or a pair the phase does not allow, is a ``ConfigError`` naming what is allowed.
    """
    notes: Notes = []
    backend = read_backend(label, raw, phase, notes)
    for note in notes:
        warnings.warn(
            f"{label}: {note.spelling!r} is a deprecated spelling of {backend.value!r}; write {backend.value!r}",
            LegacyFlagWarning,
            stacklevel=2,
        )
    return backend


def read_backend(label: str, raw: object, phase: Phase, notes: Notes) -> Backend:
    """``raw`` as a ``Backend`` that ``phase`` allows (``ALLOWED_BACKENDS_PER_PHASE``).

    A legacy spelling (``LEGACY_BACKEND_VALUES``) reads as its backend and is recorded in ``notes``.
    """
    if isinstance(raw, str) and raw in LEGACY_BACKEND_VALUES:
        notes.append(LegacyValueUse(label, phase_key(phase, "backend"), raw))
        raw = LEGACY_BACKEND_VALUES[raw]
    try:
        backend = Backend(raw)
    except ValueError:
        raise ConfigError(
            f"{label}: unknown backend {raw!r} for {phase}; allowed backends: {_names(list(Backend))}"
        ) from None
    allowed = allowed_backends(phase)
    if backend not in allowed:
        raise ConfigError(f"{label}: backend {backend.value!r} is not allowed for {phase}; allowed: {_names(allowed)}")
    return backend


def read_positive_int(label: str, raw: object) -> int:
    """``raw`` (an int, or a string of one) as a positive int."""
    value: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, str):
        try:
            value = int(raw)
        except ValueError:
            value = None
    if value is None:
        raise ConfigError(f"{label}: {raw!r} is not an integer; allowed: positive integers")
    if value <= 0:
        raise ConfigError(f"{label}: {value} is not positive; allowed: positive integers")
    return value


_SIZE_SEPARATOR = re.compile(r"\s*,\s*|\s+")


def _size_items(label: str, item: object) -> list[object]:
    # "1,2,4", "1 2 4" and "1, 2" are one command-line token (or Python string) holding several sizes.
    if not isinstance(item, str):
        return [item]
    pieces = _SIZE_SEPARATOR.split(item.strip())
    if "" in pieces:
        raise ConfigError(
            f"{label}: {item!r} has an empty entry; allowed: positive integers separated by spaces or commas"
        )
    return list(pieces)


def read_sizes(label: str, raw: object) -> tuple[int, ...]:
    """``raw`` as an ascending, deduplicated tuple of positive ints.

    ``raw`` is a list of ints or strings, or one string; a string may hold several sizes separated by commas or
    spaces, so ``1 2 4``, ``1,2,4`` and ``1,2 4`` on a command line all read as ``(1, 2, 4)``.
    """
    if isinstance(raw, str):
        raw = [raw]
    if isinstance(raw, (bytes, Mapping)) or not isinstance(raw, Sequence):
        raise ConfigError(f"{label}: expected a list of positive integers, got {raw!r}")
    if not raw:
        raise ConfigError(f"{label}: empty list; allowed: one or more positive integers")
    return tuple(sorted({read_positive_int(label, size) for item in raw for size in _size_items(label, item)}))


def read_compiler(label: str, raw: object) -> str:
    """``raw`` as one of ``TC_PIECEWISE_COMPILERS``."""
    if raw not in TC_PIECEWISE_COMPILERS:
        raise ConfigError(f"{label}: unknown compiler {raw!r}; allowed: {_names(TC_PIECEWISE_COMPILERS)}")
    return str(raw)


def read_torch_compile_mode(label: str, raw: object) -> str:
    """``raw`` as one of ``TORCH_COMPILE_MODES``; a mode that captures its own CUDA graphs
    (``CUDA_GRAPH_COMPILE_MODES``) is refused with that reason."""
    allowed = _names(TORCH_COMPILE_MODES)
    if raw in CUDA_GRAPH_COMPILE_MODES:
        raise ConfigError(
            f"{label}: torch.compile mode {raw!r} captures its own CUDA graphs, which would be captured inside ours; "
            f"allowed: {allowed}"
        )
    if raw not in TORCH_COMPILE_MODES:
        raise ConfigError(f"{label}: unknown torch.compile mode {raw!r}; allowed: {allowed}")
    return str(raw)


def read_capture_policy(label: str, raw: object) -> CapturePolicy:
    """``raw`` as a ``CapturePolicy`` (its value: ``eager`` or ``lazy``, exactly)."""
    for policy in CapturePolicy:
        if raw == policy.value:
            return policy
    raise ConfigError(f"{label}: unknown capture policy {raw!r}; allowed: {_names([p.value for p in CapturePolicy])}")


PADDING_RATIO_ALLOWED = "a number >= 1, e.g. 1.5 (a batch whose bucket is more than 1.5 times its size runs eagerly)"
PADDING_RATIO_OR_INFINITY_ALLOWED = f"{PADDING_RATIO_ALLOWED}, or inf for no limit"
"""What ``read_padding_ratio(..., allow_infinity=True)`` allows."""


def read_padding_ratio(label: str, raw: object, *, allow_infinity: bool = False) -> float:
    """``raw`` (a number, or a string of one) as a padding ratio of at least 1: the one rule for
    ``max_padding_ratio``, wherever it is read (a bucket is never smaller than its batch, and 1 replays exact sizes
    only). Finite, unless ``allow_infinity``: a ``PhaseConfig`` built in Python may say "no limit" as ``inf`` (as it
    may as ``None``), where flags and JSON say it by leaving the ratio out.

    Example:
        >>> read_padding_ratio("--decode-cuda-graph-max-padding-ratio", "1.5")
        1.5
        >>> read_padding_ratio("decode max_padding_ratio", float("inf"), allow_infinity=True)
        inf
    """
    value: float | None = None
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        try:
            value = float(raw)
        except OverflowError:  # an int beyond any float
            value = math.inf
    elif isinstance(raw, str):
        try:
            value = float(raw)
        except ValueError:
            value = None
    allowed = PADDING_RATIO_OR_INFINITY_ALLOWED if allow_infinity else PADDING_RATIO_ALLOWED
    if value is None:
        raise ConfigError(f"{label}: {raw!r} is not a number; allowed: {allowed}")
    if not (value >= 1 and (allow_infinity or math.isfinite(value))):  # `not >=` also rejects NaN
        raise ConfigError(f"{label}: {value!r} is not allowed; allowed: {allowed}")
    return value


def read_directory(label: str, raw: object) -> str:
    """``raw`` (a string or ``os.PathLike``) as a directory path, kept as written: nothing on disk is looked at."""
    path = os.fspath(raw) if isinstance(raw, os.PathLike) else raw
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{label}: {raw!r} is not allowed; allowed: a directory path (a non-empty string)")
    return path


def read_switch(label: str, raw: object) -> bool:
    """``raw`` as a switch: argparse gives ``True`` or ``None``, Python callers ``True`` or ``False``."""
    if raw is None or isinstance(raw, bool):
        return bool(raw)
    raise ConfigError(f"{label}: expected True or False, got {raw!r}")


class _JsonPairs(list[tuple[str, Any]]):
    """One parsed JSON object's ``(key, value)`` pairs in order, before its keys are checked for duplicates."""


def _without_duplicate_keys(label: str, value: object, entry: str) -> Any:
    """``value`` with every ``_JsonPairs`` made a dict; a key given twice is an error naming it as an ``entry`` at the
    top level and as a ``key`` in nested objects."""
    if isinstance(value, _JsonPairs):
        seen: dict[str, Any] = {}
        for key, item in value:
            if key in seen:
                raise ConfigError(f"{label}: {entry} {key!r} is given twice; give each {entry} at most once")
            seen[key] = _without_duplicate_keys(label, item, "key")
        return seen
    if isinstance(value, list):
        return [_without_duplicate_keys(label, item, "key") for item in value]
    return value


def json_type(value: object) -> str:
    """The JSON name of a parsed value's type, for messages (``"array"``, ``"string"``...)."""
    names = {
        bool: "boolean",
        int: "number",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)


def read_json_object(label: str, raw: object, *, what: str, entry: str, example: str) -> dict[str, object]:
    """``raw`` (JSON text, or a mapping from Python) as a dict; ``what`` the object is, an ``entry`` is a key."""
    parsed: object
    if isinstance(raw, Mapping):
        parsed = dict(raw)
    elif isinstance(raw, str):
        try:
            parsed = _without_duplicate_keys(label, json.loads(raw, object_pairs_hook=_JsonPairs), entry)
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"{label}: malformed JSON {raw!r} ({error.msg} at char {error.pos}); expected an object like {example}"
            ) from None
    else:
        raise ConfigError(f"{label}: expected JSON text, got {raw!r}; e.g. {example}")
    if not isinstance(parsed, dict):
        raise ConfigError(f"{label}: expected {what}, got {json_type(parsed)} {raw!r}; e.g. {example}")
    return parsed
