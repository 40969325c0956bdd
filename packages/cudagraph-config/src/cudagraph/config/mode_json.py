"""The per-phase JSON of ``--cuda-graph-mode``: each phase maps to a backend name, or to an object of its settings.

``{"decode": {"backend": "full", "max_padding_ratio": 1.5, "memory_budget": "2GiB"}, "prefill": "breakable"}``: the
object's keys are the rows of ``PHASE_JSON_KEYS``, each read by the same reader as its per-phase flag, into claims at
the JSON's precedence. ``{"backend": X}`` reads exactly like the string ``X``, warnings and errors included. Never
imports torch.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .memory_budget import read_memory_budget
from .values import (
    MODE_EXAMPLE,
    Claims,
    Notes,
    read_backend,
    read_capture_policy,
    read_json_object,
    read_padding_ratio,
    read_phase,
)
from .vocabulary import ConfigError, Phase, phase_key

PHASE_OBJECT_EXAMPLE = '{"decode": {"backend": "full", "max_padding_ratio": 1.5, "memory_budget": "2GiB"}}'


@dataclass(frozen=True)
class PhaseJsonKey:
    """One key of a phase's JSON object: the ``PhaseConfig`` field it sets (also its name) and how it is read."""

    name: str
    read: Callable[[str, object, Phase, Notes], object]
    """``read(label, raw, phase, notes)``: the typed value."""
    labelled: bool
    """Whether messages name the key (``--cuda-graph-mode decode.memory_budget: ...``); the backend's messages name
    the phase already and read exactly like the string form's."""


PHASE_JSON_KEYS: tuple[PhaseJsonKey, ...] = (
    PhaseJsonKey("backend", read_backend, labelled=False),
    PhaseJsonKey("max_padding_ratio", lambda label, raw, phase, notes: read_padding_ratio(label, raw), labelled=True),
    PhaseJsonKey("memory_budget", lambda label, raw, phase, notes: read_memory_budget(label, raw), labelled=True),
    PhaseJsonKey("capture_policy", lambda label, raw, phase, notes: read_capture_policy(label, raw), labelled=True),
)
"""The keys a phase's JSON object may hold."""

_KEYS_BY_NAME = {row.name: row for row in PHASE_JSON_KEYS}


def read_mode(label: str, raw: object, notes: Notes) -> Claims:
    """The ``--cuda-graph-mode`` value (JSON text, or a mapping from Python) as claims: ``<phase>.backend`` for a
    phase given as a backend name, one ``<phase>.<key>`` per key of a phase given as an object."""
    parsed = read_json_object(
        label, raw, what="a JSON object mapping phase to backend", entry="phase", example=MODE_EXAMPLE
    )
    claims: Claims = {}
    for key, value in parsed.items():
        phase = read_phase(label, key)
        if isinstance(value, Mapping):
            claims.update(_read_phase_object(label, phase, value, notes))
        else:
            claims[phase_key(phase, "backend")] = read_backend(label, value, phase, notes)
    return claims


def _read_phase_object(label: str, phase: Phase, entries: Mapping[object, object], notes: Notes) -> Claims:
    claims: Claims = {}
    for name, value in entries.items():
        row = _KEYS_BY_NAME.get(name) if isinstance(name, str) else None
        if row is None:
            raise ConfigError(_unknown_key_message(label, phase, name))
        where = f"{label} {phase_key(phase, row.name)}" if row.labelled else label
        claims[phase_key(phase, row.name)] = row.read(where, value, phase, notes)
    return claims


def _unknown_key_message(label: str, phase: Phase, name: object) -> str:
    allowed = [row.name for row in PHASE_JSON_KEYS]
    closest = difflib.get_close_matches(str(name), allowed, n=1, cutoff=0.0)
    return (
        f"{label}: unknown key {name!r} in the {phase} object; allowed keys: {', '.join(allowed)} (closest: "
        f"{closest[0]!r}); e.g. {PHASE_OBJECT_EXAMPLE}"
    )
