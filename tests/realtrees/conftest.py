"""A tree that is not in the cache skips every test of it with one summary line, saying why and what to do."""

from __future__ import annotations

import pytest

from .trees import RealTree


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip before the ``migrated`` fixture runs: raised here, pytest folds the skips of one tree into one line (a
    fixture's skip is reported at each test's own line)."""
    callspec = getattr(item, "callspec", None)
    tree = callspec.params.get("migrated") if callspec is not None else None
    if isinstance(tree, RealTree) and not tree.ready():
        pytest.skip(tree.unavailable_reason())
