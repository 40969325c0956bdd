"""Full and breakable backends on a small Llama-shaped bf16 decoder: replay == eager, one pool, memory returns."""

from __future__ import annotations

import gc

import pytest
import torch
from backend_gpu_model import DecodeHarness, TinyLlama

from cudagraph.backend import BaseCudaGraphBackend, make_backend
from cudagraph.backend_utils import BreakableCUDAGraph, CaptureOptions, DeviceMemoryProbe, free_device_memory

pytestmark = pytest.mark.gpu

BACKENDS = ["full", "breakable"]
SHAPES = [8, 4, 2, 1]
EIGHT_SHAPES = [48, 32, 24, 16, 8, 4, 2, 1]


def assert_matches_eager(replayed: torch.Tensor, expected: torch.Tensor) -> None:
    """Bitwise at batch 1; within bf16 rounding above."""
    if replayed.shape[0] == 1:
        assert torch.equal(replayed, expected), (replayed.float() - expected.float()).abs().max()
    else:
        torch.testing.assert_close(replayed, expected, atol=2e-2, rtol=2e-2)


def capture(backend: BaseCudaGraphBackend, harness: DecodeHarness, shapes: list[int]) -> None:
    with backend.capture_session():
        for shape in sorted(shapes, reverse=True):
            backend.capture_one(shape, harness.forward_fn(shape))


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_replay_equals_eager_at_several_shapes(tiny_llama: TinyLlama, backend_name: str) -> None:
    harness = DecodeHarness(tiny_llama, max_batch=max(SHAPES))
    backend = make_backend("decode", backend_name, "cuda", share_global_pool=False)
    capture(backend, harness, SHAPES)
    assert backend.shapes == tuple(sorted(SHAPES))
    if backend_name == "breakable":
        graph = backend.entry(1).graph
        assert isinstance(graph, BreakableCUDAGraph)
        assert (graph.num_segments, graph.num_eager_calls) == (tiny_llama.layers + 1, tiny_llama.layers)
    worst = {}
    for _ in range(3):
        for shape in SHAPES:
            ids, positions = harness.random_step(shape)
            expected = harness.eager(ids, positions)
            replayed = harness.replay(backend, ids, positions)
            assert replayed.shape == expected.shape == (shape, 512)
            assert_matches_eager(replayed, expected)
            difference = (replayed.float() - expected.float()).abs().max().item()
            worst[shape] = max(worst.get(shape, 0.0), difference)
    print(f"\n{backend_name}: max |replay - eager| per shape {worst}")
    backend.cleanup()
    assert not backend.has_shape(1)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_eight_shapes_largest_first_share_one_pool(tiny_llama: TinyLlama, backend_name: str) -> None:
    harness = DecodeHarness(tiny_llama, max_batch=max(EIGHT_SHAPES))
    shared = make_backend("decode", backend_name, "cuda", share_global_pool=False)
    capture(shared, harness, [1])  # lazy initialization (cuBLAS handles of the capture stream) out of the reading
    shared.cleanup()
    with DeviceMemoryProbe("cuda") as shared_probe:
        capture(shared, harness, EIGHT_SHAPES)
    private_backends = [make_backend("decode", backend_name, "cuda", share_global_pool=False) for _ in EIGHT_SHAPES]
    with DeviceMemoryProbe("cuda") as private_probe:
        for backend, shape in zip(private_backends, EIGHT_SHAPES, strict=True):
            backend.capture_stream = shared.capture_stream
            capture(backend, harness, [shape])
    print(
        f"\n{backend_name}: 8 shapes {EIGHT_SHAPES} in one pool {shared_probe.bytes_taken / 2**20:.1f} MiB "
        f"(allocator {shared_probe.reserved_bytes_taken / 2**20:.1f} MiB); one pool each "
        f"{private_probe.bytes_taken / 2**20:.1f} MiB (allocator {private_probe.reserved_bytes_taken / 2**20:.1f} MiB)"
    )
    assert 0 < shared_probe.reserved_bytes_taken < private_probe.reserved_bytes_taken
    assert shared_probe.bytes_taken < private_probe.bytes_taken
    for shape in EIGHT_SHAPES:  # every shape still replays correctly from the shared pool
        ids, positions = harness.random_step(shape)
        assert_matches_eager(harness.replay(shared, ids, positions), harness.eager(ids, positions))
    shared.cleanup()
    for backend in private_backends:
        backend.cleanup()


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_cleanup_then_recapture_ten_times_returns_memory(tiny_llama: TinyLlama, backend_name: str) -> None:
    harness = DecodeHarness(tiny_llama, max_batch=max(SHAPES))
    backend = make_backend("decode", backend_name, "cuda", share_global_pool=False)
    capture(backend, harness, SHAPES)
    backend.cleanup()
    gc.collect()
    baseline = free_device_memory("cuda")
    total = torch.cuda.get_device_properties(0).total_memory
    drifts = []
    for _ in range(10):
        capture(backend, harness, SHAPES)
        ids, positions = harness.random_step(4)
        assert_matches_eager(harness.replay(backend, ids, positions), harness.eager(ids, positions))
        backend.cleanup()
        gc.collect()
        drifts.append(baseline - free_device_memory("cuda"))
    print(f"\n{backend_name}: free-memory drift after each cleanup (MiB): {[d / 2**20 for d in drifts]}")
    assert max(abs(drift) for drift in drifts) <= 0.01 * total


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_weak_outputs_do_not_keep_the_pool_alive(tiny_llama: TinyLlama, backend_name: str) -> None:
    harness = DecodeHarness(tiny_llama, max_batch=max(SHAPES))
    warm = make_backend("decode", backend_name, "cuda", share_global_pool=False)
    capture(warm, harness, [1])
    stream = warm.capture_stream
    warm.cleanup()

    def reserved_after_cleanup(weak_outputs: bool) -> tuple[int, list[torch.Tensor]]:
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        backend = make_backend(
            "decode",
            backend_name,
            "cuda",
            share_global_pool=False,
            options=CaptureOptions(weak_ref_outputs=weak_outputs),
        )
        backend.capture_stream = stream
        outputs = []
        with backend.capture_session():
            for shape in sorted(SHAPES, reverse=True):
                outputs.append(backend.capture_one(shape, harness.forward_fn(shape)))
        backend.cleanup()
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return torch.cuda.memory_reserved() - before, outputs

    weak_left, weak_outputs = reserved_after_cleanup(weak_outputs=True)
    strong_left, strong_outputs = reserved_after_cleanup(weak_outputs=False)
    print(f"\n{backend_name}: reserved after cleanup with weak outputs {weak_left} B, strong outputs {strong_left} B")
    assert weak_left <= 0 < strong_left  # the contrast: outputs held strongly pin their pool blocks
    del strong_outputs, weak_outputs
