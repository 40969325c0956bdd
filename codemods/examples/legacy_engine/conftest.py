"""The example's own pytest setup: it runs outside the repository's tests/, so it registers the gpu marker itself."""

import importlib.util

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped with a reason elsewhere")


def _cuda_unavailable_reason():
    if importlib.util.find_spec("torch") is None:
        return "GPU test: torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return f"GPU test: CUDA is not available (torch {torch.__version__})"
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    reason = _cuda_unavailable_reason() if gpu_items else None
    if reason is not None:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))
