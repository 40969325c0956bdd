"""The test double's simulated device memory moves as a GPU's does, and out-of-memory errors are recognised through
the wrappers a capture puts around them."""

from __future__ import annotations

import pytest
import torch

from cudagraph.backend import CudaGraphCaptureError
from cudagraph.backend.testing import CpuReplayBackend, SimulatedDeviceMemory
from cudagraph.backend_utils import CaptureOptions, is_out_of_memory

MiB = 2**20
MEMORY = SimulatedDeviceMemory(total_bytes=100 * MiB, activation_bytes_per_row=MiB, graph_bytes=2 * MiB)


def forward() -> torch.Tensor:
    return torch.ones(2) * 3


def used(backend: CpuReplayBackend) -> int:
    return MEMORY.total_bytes - backend.memory_reading().free_bytes


def test_one_pool_grows_to_the_largest_forward_and_each_graph_adds_its_cost() -> None:
    backend = CpuReplayBackend(memory=MEMORY, options=CaptureOptions(num_warmups=1))
    with backend.capture_session():
        backend.capture_one(16, forward)
        assert used(backend) == 16 * MiB + 2 * MiB
        backend.capture_one(4, forward)  # reuses the pool
        assert used(backend) == 16 * MiB + 2 * 2 * MiB
        backend.discard(16)  # its graph goes, the pool stays
        assert used(backend) == 16 * MiB + 2 * MiB
        with pytest.raises(RuntimeError, match="still hold graphs"):
            backend.renew_pool()
    reading = backend.memory_reading(reset_peak=True)
    assert reading.peak_allocated_bytes == 16 * MiB  # the 16-row forward, before any graph was kept
    assert backend.memory_reading().peak_allocated_bytes == reading.allocated_bytes == 2 * MiB
    backend.cleanup()
    assert used(backend) == 0


def test_a_scratch_session_is_freed_when_it_ends_and_leaves_the_kept_graphs() -> None:
    backend = CpuReplayBackend(memory=MEMORY)
    with backend.capture_session():
        backend.capture_one(4, forward)
    kept = used(backend)
    with backend.scratch_session():
        backend.capture_one(32, forward)
        assert used(backend) == kept + 32 * MiB + 2 * MiB and backend.shapes == (32,)
    assert used(backend) == kept and backend.shapes == (4,)
    assert backend.probed == [32] and backend.captured_order == [4]


def test_a_capture_that_does_not_fit_or_is_told_to_fail_is_an_out_of_memory_and_keeps_nothing() -> None:
    backend = CpuReplayBackend(memory=MEMORY, out_of_memory_shapes={2})
    with backend.capture_session():
        with pytest.raises(CudaGraphCaptureError, match="shape 200") as too_big:
            backend.capture_one(200, forward)
        with pytest.raises(CudaGraphCaptureError, match="injected") as injected:
            backend.capture_one(2, forward)
    for raised in (too_big, injected):
        assert isinstance(raised.value.__cause__, torch.OutOfMemoryError) and is_out_of_memory(raised.value)
    assert backend.entries == {} and used(backend) == 0


def test_out_of_memory_is_told_apart_from_other_errors() -> None:
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory\nCompile with TORCH_USE_CUDA_DSA"))
    assert not is_out_of_memory(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not is_out_of_memory(ValueError("CUDA error: out of memory"))
    try:
        try:
            raise torch.OutOfMemoryError("out of memory")
        except torch.OutOfMemoryError:
            raise RuntimeError("capturing failed") from None  # context kept, cause suppressed
    except RuntimeError as error:
        assert is_out_of_memory(error)
