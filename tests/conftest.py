"""Shared test configuration: GPU tests skip with a reason where CUDA is absent; hypothesis profiles; Triton's
interpreter on machines without an NVIDIA device (so the Triton kernels' tests run on CPU tensors)."""

from __future__ import annotations

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


def _cuda_unavailable_reason() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "GPU test: torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return f"GPU test: CUDA is not available (torch {torch.__version__}); run `nox -s gpu` on a CUDA machine"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark GPU tests skipped, with the reason, when this machine has no CUDA device."""
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    reason = _cuda_unavailable_reason()
    if reason is None:
        return
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.skip(reason=reason))
