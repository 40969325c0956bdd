"""Deprecated spellings of backend values (``"tcpcg"`` -> ``tc_piecewise``): one table, read wherever a backend is.

The rows are the ``config_string`` rows of ``refactor/renames.toml``; this distribution ships without that file, so
it keeps this copy and a test holds the two equal. A spelling here resolves exactly like its backend and raises one
``LegacyFlagWarning`` per ``resolve`` call. Never imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from .vocabulary import DEPRECATED_IN, REMOVED_IN, Backend

LEGACY_BACKEND_VALUES: Mapping[str, Backend] = MappingProxyType(
    {
        "tcpiecewise": Backend.TC_PIECEWISE,
        "tcpcg": Backend.TC_PIECEWISE,
    }
)
"""Deprecated backend value spelling -> the backend it means; accepted in ``--cuda-graph-mode`` JSON, the per-phase
backend flags and their keywords until ``REMOVED_IN``."""


def legacy_value_message(spelling: str, labels: Sequence[str]) -> str:
    """The one warning a legacy ``spelling`` raises per ``resolve`` call, naming the flags that used it."""
    return (
        f"backend value {spelling!r} (in {', '.join(labels)}) is deprecated since cudagraph-config {DEPRECATED_IN} "
        f"and will be removed in {REMOVED_IN}; use {LEGACY_BACKEND_VALUES[spelling].value!r} instead"
    )
