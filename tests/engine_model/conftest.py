"""Fixtures the model-level tests of traced forwards and Triton kernels share (asked for by name with
``pytest.mark.usefixtures``)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters


@pytest.fixture
def interpreter_or_gpu() -> None:
    """Skip where Triton's kernels cannot run: no CUDA device and the interpreter off."""
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip(
            "no CUDA device and Triton's interpreter is off: set TRITON_INTERPRET=1 before torch is imported "
            "(tests/conftest.py does where /dev/nvidiactl is absent)"
        )


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """Dynamo's caches and counters empty before the test and after it."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
