"""The attention backends a GPU test runs over: torch, FlashInfer (skipped, saying how to install it, where it is
not installed) and Triton."""

from __future__ import annotations

import importlib.util

import pytest

NO_FLASHINFER = importlib.util.find_spec("flashinfer") is None


def attention_params() -> list:
    """``pytest.param`` of each attention backend, FlashInfer's marked to skip where it is not installed."""
    skip_flashinfer = pytest.mark.skipif(
        NO_FLASHINFER,
        reason=(
            "flashinfer is not installed: pip install flashinfer-python into the GPU interpreter (or "
            "put its wheels in .whl/, which `nox -s gpu` unpacks)"
        ),
    )
    return [pytest.param("torch"), pytest.param("flashinfer", marks=skip_flashinfer), pytest.param("triton")]
