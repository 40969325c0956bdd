"""Fixtures of the cudagraph.config unit tests."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
from config_helpers import recorded_warnings


@pytest.fixture
def no_warnings() -> Iterator[list[warnings.WarningMessage]]:
    """Fails the test if resolving raised any warning."""
    with recorded_warnings() as caught:
        yield caught
    assert [str(warning.message) for warning in caught] == []
