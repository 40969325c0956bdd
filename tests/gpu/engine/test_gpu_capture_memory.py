"""Graph memory on a real GPU: the estimate made before capture against what the capture then takes, a memory budget
that captures a prefix of the buckets (the rest served eagerly), an out-of-memory injected mid-capture, and every
byte back after ``shutdown``.

The model is Qwen3-0.6B's shape with random weights in bfloat16 (the benchmark's model and dtype), so the pool and the
graphs weigh tens of MiB, well above the 2 MiB pages in which the driver hands out memory; a tiny model's figures
would be all rounding. One engine serves every test; each test makes and shuts down its own runners.

How "nothing leaks" is read: free device memory (``torch.cuda.mem_get_info`` after ``synchronize`` and
``empty_cache``, ``read_device_memory``) and the allocator's live bytes, both taken before the runner is made and after
its ``shutdown``, each time right after the same eager step (the engine keeps a reference to the last step's
tensors until its next step, which is the engine's, not the runner's). The live bytes must not grow by a byte (they
may shrink: a runner's attention state replaces the engine's eager metadata, which is then freed); free memory must
come back within ``PAGE`` (2 MiB): the driver's granularity, so a difference below it is no whole page lost. What a
process loads once for good (the capture stream's cuBLAS workspace, lazily loaded kernels) is loaded by the module
fixture's first capture, before any baseline.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from cudagraph.backend_utils import read_device_memory
from cudagraph.config import Backend, CudaGraphConfig, MemoryBudget, PhaseConfig
from cudagraph.engine.model import model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.engine.testing import release_synthetic_batch, synthetic_decode_batch
from cudagraph.runner import (
    BaseCudaGraphRunner,
    DecodeCudaGraphRunner,
    EagerReason,
    ForwardBatch,
    PrefillCudaGraphRunner,
)

pytestmark = pytest.mark.gpu

PRESET = "qwen3-0.6b-random"
DECODE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
PREFILL_BUCKETS = (64, 128, 256, 512, 1024)
ESTIMATE_TOLERANCE = 0.15
"""The issue's target: the estimate within 15 % of the measured ``CaptureStats.bytes``."""
PAGE = 2 * 2**20
"""Free device memory moves in 2 MiB pages: a difference below one page is no page lost."""
BF16_LOGITS = {"rtol": 2e-2, "atol": 2e-2}
CONTEXT = 40

EAGER = CudaGraphConfig(decode=PhaseConfig(Backend.DISABLED, (), 0), prefill=PhaseConfig(Backend.DISABLED, (), 0))


def config(
    decode: Backend = Backend.DISABLED, prefill: Backend = Backend.DISABLED, budget: MemoryBudget | None = None
) -> CudaGraphConfig:
    return CudaGraphConfig(
        decode=PhaseConfig(decode, () if decode is Backend.DISABLED else DECODE_BUCKETS, 128, memory_budget=budget),
        prefill=PhaseConfig(prefill, () if prefill is Backend.DISABLED else PREFILL_BUCKETS, 1024),
    )


def make_runner(engine: ModelRunner, phase: str, graphs: CudaGraphConfig) -> BaseCudaGraphRunner:
    runner_type = DecodeCudaGraphRunner if phase == "decode" else PrefillCudaGraphRunner
    return runner_type(engine, graphs, show_progress=False)


WARM_UP_CAPTURES = (
    ("decode", config(decode=Backend.FULL)),
    ("decode", config(decode=Backend.BREAKABLE)),
    ("prefill", config(prefill=Backend.BREAKABLE)),
)
"""Captured and shut down once before any test measures, so every kernel and workspace is loaded by then."""


@pytest.fixture(scope="module")
def engine() -> Iterator[ModelRunner]:
    """The bf16 Qwen3-0.6B-shaped engine, with one capture made and shut down (process-lifetime loads done)."""
    model = random_model(model_config_from_preset(PRESET), seed=3, dtype="bfloat16", device="cuda")
    cache = CacheConfig(max_num_reqs=136, max_context_len=1100, num_kv_slots=8192)
    model_runner = ModelRunner(model, EAGER, cache_config=cache, attention_backend="torch")
    for phase, graphs in WARM_UP_CAPTURES:
        warm = make_runner(model_runner, phase, graphs)
        warm.capture()
        warm.shutdown()
    yield model_runner
    del model_runner
    torch.cuda.empty_cache()


class StepBaseline:
    """The device memory after one fixed eager step: taken before a runner exists and again after its shutdown.
    ``release`` gives the step's request rows back (the ``baseline`` fixture calls it, whatever the test did)."""

    def __init__(self, engine: ModelRunner) -> None:
        self.engine = engine
        self.batch = synthetic_decode_batch(engine, 3, CONTEXT, seed=11)
        self.before = self.read()

    def release(self) -> None:
        release_synthetic_batch(self.engine, self.batch, CONTEXT)

    def read(self) -> tuple[int, int]:
        self.engine.forward(self.batch)
        reading = read_device_memory()
        return reading.free_bytes, reading.allocated_bytes

    def check_nothing_leaked(self, what: str) -> None:
        (free_before, live_before), (free_after, live_after) = self.before, self.read()
        print(
            f"\n{what}: free {free_before / 2**20:.1f} -> {free_after / 2**20:.1f} MiB, "
            f"live {live_before} -> {live_after} bytes"
        )
        assert live_after <= live_before, f"{what}: {live_after - live_before} bytes still live after shutdown"
        # Live bytes may not grow at all; free memory may differ by one small-block segment of the allocator (2 MiB,
        # seen once on the H100 with live bytes unchanged: the step's small tensors landing in another segment).
        assert free_before - free_after <= PAGE, f"{what}: {free_before - free_after} bytes of free memory lost"


@pytest.fixture
def baseline(engine: ModelRunner) -> Iterator[StepBaseline]:
    """A ``StepBaseline`` taken now, its request rows given back when the test ends (passed or not)."""
    step = StepBaseline(engine)
    yield step
    step.release()


@pytest.mark.parametrize(
    ("phase", "backend"), [("decode", Backend.FULL), ("decode", Backend.BREAKABLE), ("prefill", Backend.BREAKABLE)]
)
def test_the_estimate_is_within_15_percent_of_the_capture_and_shutdown_gives_it_all_back(
    engine: ModelRunner, baseline: StepBaseline, phase: str, backend: Backend
) -> None:
    graphs = config(decode=backend) if phase == "decode" else config(prefill=backend)
    runner = make_runner(engine, phase, graphs)
    try:
        free_before_estimate = read_device_memory().free_bytes
        estimate = runner.estimate_capture_memory()
        # The probes are freed: the estimate takes nothing for good (free memory may rise: cached blocks go back).
        assert free_before_estimate - read_device_memory().free_bytes < PAGE
        stats = runner.capture()
    finally:
        runner.shutdown()
    error = (estimate.total_bytes - stats.bytes) / stats.bytes
    print(
        f"\n{phase} {backend}: estimate {estimate.total_bytes / 2**20:.1f} MiB, measured {stats.bytes / 2**20:.1f} MiB "
        f"({error:+.1%}); {estimate}"
    )
    assert stats.graphs == len(runner.buckets) and stats.estimate_bytes == estimate.total_bytes
    assert abs(error) <= ESTIMATE_TOLERANCE, f"estimate off by {error:+.1%}"
    baseline.check_nothing_leaked(f"{phase} {backend}")


def test_a_budget_of_half_the_estimate_captures_a_prefix_and_serves_the_rest_eagerly(engine: ModelRunner) -> None:
    probe = make_runner(engine, "decode", config(decode=Backend.FULL))
    try:
        estimate = probe.estimate_capture_memory()
    finally:
        probe.shutdown()
    budget = MemoryBudget(bytes=estimate.total_bytes // 2)
    runner = make_runner(engine, "decode", config(decode=Backend.FULL, budget=budget))
    try:
        stats = runner.capture()
        kept = runner.captured_buckets
        print(f"\nbudget {budget}: captured {list(kept)}, skipped {runner.skipped_buckets}; {stats.summary()}")
        assert kept and kept == DECODE_BUCKETS[: len(kept)] and len(kept) < len(DECODE_BUCKETS)
        assert stats.bytes <= budget.limit_bytes(0)
        assert all("budget" in reason for reason in runner.skipped_buckets.values())
        for batch_size in (kept[-1], kept[-1] + 1, DECODE_BUCKETS[-1]):
            batch = synthetic_decode_batch(engine, batch_size, CONTEXT, seed=batch_size)
            try:
                want = engine.forward(batch).clone()
                route = runner.route(batch)
                have = runner.replay(batch)
                if batch_size <= kept[-1]:
                    assert route.bucket is not None
                    torch.testing.assert_close(have, want, **BF16_LOGITS)
                else:
                    assert route.reason is EagerReason.OVER_BUDGET
                    assert torch.equal(have, want), "a batch over the budget runs the eager forward itself"
                assert torch.equal(have.argmax(-1), want.argmax(-1))
            finally:
                release_synthetic_batch(engine, batch, CONTEXT)
    finally:
        runner.shutdown()


def out_of_memory_at(engine: ModelRunner, batch_size: int) -> Callable[[ForwardBatch], torch.Tensor]:
    """``engine.forward``, plus an allocation larger than the device while a batch of ``batch_size`` is captured."""
    forward = engine.forward

    def run(batch: ForwardBatch) -> torch.Tensor:
        logits = forward(batch)
        if torch.cuda.is_current_stream_capturing() and batch.batch_size == batch_size:
            torch.empty(2 * torch.cuda.get_device_properties(0).total_memory, dtype=torch.uint8, device="cuda")
        return logits

    return run


def capture_through_an_out_of_memory(engine: ModelRunner, backend: Backend) -> tuple[BaseCudaGraphRunner, int]:
    """A decode runner whose capture ran out of memory at its third largest bucket (the capture does not raise)."""
    third = sorted(DECODE_BUCKETS, reverse=True)[2]
    runner = make_runner(engine, "decode", config(decode=backend))
    engine.forward = out_of_memory_at(engine, third)  # type: ignore[method-assign]
    try:
        runner.capture()
    finally:
        del engine.forward  # the class's forward again
    return runner, third


@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE])
def test_after_an_out_of_memory_mid_capture_shutdown_gives_every_byte_back(
    engine: ModelRunner, backend: Backend
) -> None:
    """Measured from a process that has been through this backend's out-of-memory once already.

    Outside torch's allocator (reserved bytes and segments unchanged, no graph object alive), the driver holds 4 MiB
    more after a breakable out-of-memory than after a full one, and the state flips with whichever ran last: on the
    H100, full then breakable lost 4 MiB, breakable again 0, full again gained 4 MiB back, breakable again lost them.
    That is where the process's driver state is, not what a capture keeps: a capture that kept anything would lose
    it again on every repeat. So one out-of-memory capture of the same backend runs first, then the baseline, then
    the measured one."""
    first, _ = capture_through_an_out_of_memory(engine, backend)
    first.shutdown()
    del first
    baseline = StepBaseline(engine)
    try:
        runner, _ = capture_through_an_out_of_memory(engine, backend)
        runner.shutdown()
        del runner
        baseline.check_nothing_leaked(f"{backend} after an out-of-memory")
    finally:
        baseline.release()


@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE])
def test_an_out_of_memory_at_the_third_shape_leaves_no_graph_of_it_and_serves_the_rest_eagerly(
    engine: ModelRunner, backend: Backend
) -> None:
    runner, third = capture_through_an_out_of_memory(engine, backend)
    stats = runner.stats
    try:
        print(f"\n{backend} out of memory at {third}: {stats.summary()}; skipped {runner.skipped_buckets}")
        assert runner.captured_buckets == tuple(sorted(DECODE_BUCKETS, reverse=True)[:2])[::-1]
        assert runner.skipped_buckets[third] == "CUDA out of memory while capturing"
        assert set(runner.skipped_buckets) == {bucket for bucket in DECODE_BUCKETS if bucket <= third}
        assert not runner.backend.has_shape(third)
        with torch.cuda.stream(runner.backend.capture_stream):
            assert not torch.cuda.is_current_stream_capturing()
        batch = synthetic_decode_batch(engine, third, CONTEXT, seed=5)
        try:
            want = engine.forward(batch).clone()
            assert runner.route(batch).reason is EagerReason.OVER_BUDGET and torch.equal(runner.replay(batch), want)
        finally:
            release_synthetic_batch(engine, batch, CONTEXT)
    finally:
        runner.shutdown()
