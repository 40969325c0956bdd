"""The shims leave on schedule: a shim still present once its owner reaches the row's removal version fails here."""

from __future__ import annotations

import pytest
from distributions.workspace import load_distributions  # tests/ is on sys.path: it holds the root conftest
from packaging.version import Version

from cudagraph.legacy import shim_entries

DISTRIBUTIONS = load_distributions()


def _version(distribution: str) -> Version:
    return Version(DISTRIBUTIONS[distribution].version)


def overdue(entries) -> list[str]:
    """The entries whose owner distribution has reached the removal version."""
    return [
        f"{entry.row.old}: {entry.owner_distribution} is at {_version(entry.owner_distribution)}, "
        f"but the shim was due to go in {entry.removed_in}"
        for entry in entries
        if _version(entry.owner_distribution) >= Version(entry.removed_in)
    ]


@pytest.mark.parametrize("entry", shim_entries(), ids=lambda entry: entry.row.old)
def test_shim_is_not_overdue(entry) -> None:
    assert overdue([entry]) == []


def test_the_check_catches_an_overdue_shim() -> None:
    from dataclasses import replace

    entry = shim_entries()[0]
    early = replace(entry, row=replace(entry.row, removed_in="0.0.1"))
    assert overdue([early]) == [
        f"{entry.row.old}: {entry.owner_distribution} is at {_version(entry.owner_distribution)}, "
        "but the shim was due to go in 0.0.1"
    ]
