"""The harness lives under ``bench/``: put that folder on the path, share one model cache per session, and skip
the comparisons with the peer libraries where they are not installed."""

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


@pytest.fixture
def peers() -> None:
    """Skips a test that compares with the peer libraries unless both are installed."""
    pytest.importorskip(
        "breakable_cuda_graphs",
        reason=("compares with breakable-cuda-graphs: pip install breakable-cuda-graphs (or put its wheel in .whl/)"),
    )
    pytest.importorskip(
        "piecewise_cuda_graphs",
        reason=("compares with piecewise-cuda-graphs: put its wheel in .whl/, which `nox -s gpu` unpacks"),
    )
