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


Forward = Callable[[], torch.Tensor]


def while_capturing(misstep: Callable[[torch.Tensor], None]) -> Callable[[Forward], Forward]:
    """Wraps a ``forward`` so that ``misstep(logits)`` runs after it, only while a stream is being captured."""

    def wrap(forward: Forward) -> Forward:
        def run() -> torch.Tensor:
            logits = forward()
            if torch.cuda.is_current_stream_capturing():
                misstep(logits)
            return logits

        return run

    return wrap


def read_back(logits: torch.Tensor) -> None:
    """A host read-back, which is illegal only while a stream is being captured."""
    logits.sum().item()


def allocate_more_than_the_device(logits: torch.Tensor) -> None:
    """An allocation larger than the device."""
    torch.empty(2 * torch.cuda.get_device_properties(0).total_memory, dtype=torch.uint8, device="cuda")


def fail(logits: torch.Tensor) -> None:
    """A plain Python error half-way through the capture."""
    raise ValueError("model code failed mid-capture")


FAILURES = {
    "illegal-sync": (while_capturing(read_back), RuntimeError),
    "out-of-memory": (while_capturing(allocate_more_than_the_device), torch.OutOfMemoryError),
    "exception": (while_capturing(fail), ValueError),
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
