"""The harness lives under ``bench/``: put that folder on the path, and share one model cache per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))


@pytest.fixture(scope="session")
def models():  # type: ignore[no-untyped-def]
    """The harness's model cache: each preset's random bf16 model is built once for all these tests."""
    from harness.models import ModelCache

    return ModelCache()
