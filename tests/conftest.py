"""Shared test configuration: GPU tests skip with one reason where CUDA is absent; hypothesis profiles; Triton's
interpreter on machines without an NVIDIA device (so the Triton kernels' tests run on CPU tensors).

Hypothesis profiles: ``ci`` (the default, 200 examples: ``nox -s property``), ``dev`` (50: what ``nox -s tests``
sets) and ``deep`` (5,000; what ``nox -s property -- --hypothesis-profile=deep`` and ``.ci/run`` use).
``HYPOTHESIS_PROFILE=NAME`` or pytest's ``--hypothesis-profile=NAME`` picks one; a test's own
``@settings(max_examples=...)`` takes precedence over it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

# Read when a kernel is decorated, and Triton's own helpers are decorated when it is first imported (torch._dynamo
# imports it): this must run before anything imports torch's compiler.
if not Path("/dev/nvidiactl").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@functools.cache
def _cuda_unavailable_reason() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "GPU test: torch is not installed here; run `nox -s gpu` on a CUDA machine with a CUDA build of torch"
    import torch

    if not torch.cuda.is_available():
        return f"GPU test: CUDA is not available (torch {torch.__version__}); run `nox -s gpu` on a CUDA machine"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a GPU test where CUDA is absent, before its own skip marks (flashinfer, two devices) are read.

    Raised here rather than added as a mark so that pytest folds every such skip into one summary line (a mark's skip
    is reported at each test's own line), and so that a CPU machine says "no CUDA" rather than "no flashinfer".
    """
    if item.get_closest_marker("gpu") is None:
        return
    reason = _cuda_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    _forget_compiled_frames()


def _forget_compiled_frames() -> None:
    """Every GPU test compiles its own engines' forwards: dynamo's caches of the tests before it only count against
    its recompile limit (a forward compiled by eight earlier engines fails a ninth under ``fullgraph=True``)."""
    import torch._dynamo

    torch._dynamo.reset()
