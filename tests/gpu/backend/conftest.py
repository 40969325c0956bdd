"""Fixtures of the backend GPU tests: one small Llama-shaped model per module."""

from __future__ import annotations

import pytest
from backend_gpu_model import TinyLlama


@pytest.fixture(scope="module")
def tiny_llama() -> TinyLlama:
    """One small model per test module (weights and KV cache stay on the device)."""
    return TinyLlama()
