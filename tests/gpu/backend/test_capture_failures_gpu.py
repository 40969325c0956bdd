"""A capture that fails (op illegal under capture, out-of-memory, exception) leaves nothing behind; the next works."""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest
import torch
from backend_gpu_model import DecodeHarness, TinyLlama

from cudagraph.backend import BaseCudaGraphBackend, CudaGraphCaptureError, make_backend

pytestmark = pytest.mark.gpu

BACKENDS = ["full", "breakable"]


def sync_while_capturing(forward: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """``forward`` plus a host read-back, which is illegal only while a stream is being captured."""

    def run() -> torch.Tensor:
        logits = forward()
        if torch.cuda.is_current_stream_capturing():
            logits.sum().item()
        return logits

    return run


def oom_while_capturing(forward: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """``forward`` plus an allocation larger than the device, only while capturing."""

    def run() -> torch.Tensor:
        logits = forward()
        if torch.cuda.is_current_stream_capturing():
            total = torch.cuda.get_device_properties(0).total_memory
            torch.empty(2 * total, dtype=torch.uint8, device="cuda")
        return logits

    return run


def raise_while_capturing(forward: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """``forward`` that raises a plain Python error half-way through the capture."""

    def run() -> torch.Tensor:
        logits = forward()
        if torch.cuda.is_current_stream_capturing():
            raise ValueError("model code failed mid-capture")
        return logits

    return run


FAILURES = {
    "illegal-sync": (sync_while_capturing, RuntimeError),
    "out-of-memory": (oom_while_capturing, torch.OutOfMemoryError),
    "exception": (raise_while_capturing, ValueError),
}


def reserved_after_cleanup(backend: BaseCudaGraphBackend) -> int:
    backend.cleanup()
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved()


@pytest.mark.parametrize("failure", list(FAILURES))
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_failed_capture_leaves_nothing_and_the_next_succeeds(
    tiny_llama: TinyLlama, backend_name: str, failure: str
) -> None:
    wrap, cause_type = FAILURES[failure]
    harness = DecodeHarness(tiny_llama, max_batch=8)
    backend = make_backend("decode", backend_name, "cuda", share_global_pool=False)
    with backend.capture_session():
        backend.capture_one(8, harness.forward_fn(8))  # a good shape before the failure
    baseline_reserved = reserved_after_cleanup(backend)

    with backend.capture_session():
        backend.capture_one(8, harness.forward_fn(8))
        with pytest.raises(CudaGraphCaptureError) as raised:
            backend.capture_one(4, wrap(harness.forward_fn(4)))
        message = str(raised.value)
        assert "shape 4" in message and backend_name in message, message
        assert isinstance(raised.value.__cause__, cause_type), repr(raised.value.__cause__)
        assert type(raised.value.__cause__).__name__ in message
        # The error's traceback holds the failed forward's frames (and their pool tensors); a caller that handled
        # the error drops it, and so does this test before measuring memory.
        del raised
        assert not backend.has_shape(4)
        with torch.cuda.stream(backend.capture_stream):
            assert not torch.cuda.is_current_stream_capturing()
        # The next capture of the same shape works, and so do the older graphs.
        backend.capture_one(4, harness.forward_fn(4))
    for shape in (8, 4):
        ids, positions = harness.random_step(shape)
        torch.testing.assert_close(harness.replay(backend, ids, positions), harness.eager(ids, positions))
    print(f"\n{backend_name}/{failure}: {message[:160]}")
    # Nothing of the failed capture stays reserved once everything is cleaned up.
    assert reserved_after_cleanup(backend) <= baseline_reserved
