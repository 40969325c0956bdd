"""Fixtures for the runner tests; the helpers they and the tests use are in ``runner_helpers`` (a module of its own
name, so that running these tests beside another folder's ``conftest`` never imports the wrong one)."""

from __future__ import annotations

import pytest
from runner_helpers import make_model_runner

from cudagraph.engine.model_runner import ModelRunner


@pytest.fixture
def model_runner() -> ModelRunner:
    return make_model_runner()
