"""Measuring a capture without keeping it: a scratch session captures into a pool of its own and frees everything it
captured when it ends, leaving the graphs captured before it as they were; ``renew_pool`` gives an emptied pool back.
"""

from __future__ import annotations

import pytest
import torch
from backend_gpu_model import DecodeHarness, TinyLlama

from cudagraph.backend import make_backend
from cudagraph.backend_utils import read_device_memory

pytestmark = pytest.mark.gpu

BACKENDS = ["full", "breakable"]


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_a_scratch_session_frees_what_it_captured_and_leaves_the_kept_graphs_alone(
    tiny_llama: TinyLlama, backend_name: str
) -> None:
    harness = DecodeHarness(tiny_llama, max_batch=16)
    backend = make_backend("decode", backend_name, "cuda", share_global_pool=False)
    try:
        with backend.capture_session():
            backend.capture_one(8, harness.forward_fn(8))
        kept = backend.entry(8)
        before = read_device_memory()
        with backend.scratch_session():
            backend.warm_up(16, harness.forward_fn(16))
            backend.capture_one(16, harness.forward_fn(16))
            backend.capture_one(4, harness.forward_fn(4))
            assert backend.shapes == (4, 16)
            during = read_device_memory()
        after = read_device_memory()
        print(
            f"\n{backend_name}: reserved {before.reserved_bytes} -> {during.reserved_bytes} (scratch) -> "
            f"{after.reserved_bytes} bytes"
        )
        assert during.reserved_bytes > before.reserved_bytes, "the scratch captures took memory of their own"
        assert (after.reserved_bytes, after.allocated_bytes) == (before.reserved_bytes, before.allocated_bytes)
        assert backend.shapes == (8,) and backend.entry(8) is kept
        ids, positions = harness.random_step(8)
        torch.testing.assert_close(harness.replay(backend, ids, positions), harness.eager(ids, positions))
        backend.discard(8)
        backend.renew_pool()
        emptied = read_device_memory()
        assert emptied.reserved_bytes < before.reserved_bytes, "an emptied, renewed pool gives its memory back"
    finally:
        backend.cleanup()
