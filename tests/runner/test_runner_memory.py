"""Graph memory before capture, a budget that never runs out of memory, and an out-of-memory that leaves nothing
behind: the runner against the real CPU engine, through the test double with its simulated device memory.

The simulated memory moves as a GPU's does (a shared pool as large as the largest forward captured into it, a cost
per graph, out-of-memory errors past its total), so the estimate can be checked against what the capture then takes,
and the budget against what the capture kept.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import weakref

import pytest
import torch
from runner_helpers import admit, make_model_runner, prefill_eagerly, prompts_of

from cudagraph.backend.testing import CpuReplayBackend, SimulatedDeviceMemory
from cudagraph.config import Backend, CudaGraphConfig, MemoryBudget, PhaseConfig
from cudagraph.engine import model_runner as model_runner_module
from cudagraph.engine.batch import make_decode_batch, make_extend_batch
from cudagraph.engine.model import model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.runner import DecodeCudaGraphRunner, EagerReason, ForwardBatch, PrefillCudaGraphRunner
from cudagraph.runner.capture_loop import drop_failed_frames

MiB = 2**20
MEMORY = SimulatedDeviceMemory(
    total_bytes=1024 * MiB, activation_bytes_per_row=3 * MiB, graph_bytes=MiB, graph_bytes_per_row=64 * 1024
)
DECODE_BUCKETS = (1, 2, 4, 8, 12, 16)


def decode_config(budget: MemoryBudget | None = None, buckets: tuple[int, ...] = DECODE_BUCKETS) -> CudaGraphConfig:
    return CudaGraphConfig(
        decode=PhaseConfig(Backend.FULL, buckets, max(buckets), memory_budget=budget),
        prefill=PhaseConfig(Backend.BREAKABLE, (16, 32, 64), 64, memory_budget=budget),
    )


def decode_runner(
    model_runner,
    budget: MemoryBudget | None = None,
    *,
    kind: Backend = Backend.FULL,
    memory: SimulatedDeviceMemory | None = MEMORY,
    out_of_memory_shapes: tuple[int, ...] = (),
) -> tuple[DecodeCudaGraphRunner, CpuReplayBackend]:
    backend = CpuReplayBackend(kind, memory=memory, out_of_memory_shapes=out_of_memory_shapes)
    runner = DecodeCudaGraphRunner(model_runner, decode_config(budget), backend=backend, show_progress=False)
    return runner, backend


def decode_batch(model_runner, batch_size: int, seed: int = 0) -> ForwardBatch:
    requests = admit(model_runner, prompts_of([3 + (i % 5) for i in range(batch_size)], seed=seed))
    prefill_eagerly(model_runner, requests)
    return make_decode_batch(requests, model_runner.device)


def used_bytes(backend: CpuReplayBackend) -> int:
    reading = backend.memory_reading()
    assert backend.memory is not None
    return backend.memory.total_bytes - reading.free_bytes


def simulated_total(buckets: list[int], memory: SimulatedDeviceMemory = MEMORY) -> int:
    """What the simulated device gives ``buckets`` captured largest first into one pool."""
    return memory.activation(max(buckets)) + sum(memory.graph(bucket) for bucket in buckets)


# -- the estimate ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [Backend.FULL, Backend.BREAKABLE])
def test_the_estimate_matches_what_the_capture_then_takes(kind: Backend) -> None:
    model_runner = make_model_runner(config=decode_config())
    runner, _ = decode_runner(model_runner, kind=kind)
    estimate = runner.estimate_capture_memory()
    assert estimate.buckets == DECODE_BUCKETS
    stats = runner.capture()
    assert stats.bytes == simulated_total(list(DECODE_BUCKETS))
    assert estimate.total_bytes == stats.bytes == stats.estimate_bytes
    assert estimate.pool_bytes == MEMORY.activation(16)
    assert estimate.graph_bytes == {bucket: MEMORY.graph(bucket) for bucket in DECODE_BUCKETS}
    assert sum(estimate.per_bucket_bytes.values()) == estimate.total_bytes
    assert f"(estimate {stats.bytes / 2**30:.3f} GiB)" in stats.summary()


def test_the_estimate_captures_a_few_probes_and_leaves_nothing_behind() -> None:
    model_runner = make_model_runner(config=decode_config())
    runner, backend = decode_runner(model_runner)
    estimate = runner.estimate_capture_memory()
    assert backend.probed == [16, 8, 2, 1] == [probe.bucket for probe in estimate.probes]
    assert backend.captured_order == [] and backend.entries == {}
    assert used_bytes(backend) == 0 and not runner.captured
    # Asked again (and by capture), it is not measured again.
    assert runner.estimate_capture_memory() is estimate
    runner.capture()
    assert backend.probed == [16, 8, 2, 1]
    assert runner.estimate_capture_memory(refresh=True) is not estimate and len(backend.probed) == 8
    assert "for 6 graphs" in str(estimate) and "probes 16, 8, 2, 1" in str(estimate)


def test_a_prefill_estimate_scales_the_pool_for_a_smaller_largest_bucket() -> None:
    model_runner = make_model_runner(config=decode_config())
    backend = CpuReplayBackend(Backend.BREAKABLE, memory=MEMORY)
    runner = PrefillCudaGraphRunner(model_runner, decode_config(), backend=backend, show_progress=False)
    estimate = runner.estimate_capture_memory()
    assert estimate.total_bytes == simulated_total([16, 32, 64])
    assert estimate.pool_bytes_for(32) == MEMORY.activation(32)
    assert estimate.total_bytes_for([16, 32]) == simulated_total([16, 32])


def test_without_a_budget_or_a_request_capture_estimates_nothing() -> None:
    model_runner = make_model_runner(config=decode_config())
    runner, backend = decode_runner(model_runner)
    stats = runner.capture()
    assert backend.probed == [] and stats.estimate_bytes is None
    assert "estimate" not in stats.summary()


def started_engine(
    monkeypatch: pytest.MonkeyPatch, budget: MemoryBudget | None = None, *, log_capture_estimate: bool = False
) -> tuple[ModelRunner, CpuReplayBackend]:
    """The engine's own start of its decode graphs (``init_decode_cuda_graph``), on the simulated device as if on
    CUDA: its decode runner captures through the test double."""
    backend = CpuReplayBackend(Backend.FULL, memory=MEMORY)

    class SimulatedDecodeRunner(DecodeCudaGraphRunner):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, backend=backend, **kwargs)

    model = random_model(model_config_from_preset("tiny-qwen3-random"), seed=0, dtype="float32", device="cpu")
    cache = CacheConfig(16, max_context_len=64)
    engine = ModelRunner(model, decode_config(budget), cache_config=cache, log_capture_estimate=log_capture_estimate)
    monkeypatch.setattr(engine, "graphs_unavailable_reason", lambda phase: None)
    monkeypatch.setattr(model_runner_module, "DecodeCudaGraphRunner", SimulatedDecodeRunner)
    assert engine.init_decode_cuda_graph() is not None
    return engine, backend


def test_a_plain_engine_start_makes_no_probe_captures(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="cudagraph"):
        engine, backend = started_engine(monkeypatch)
    runner = engine.decode_cuda_graph_runner
    assert runner is not None and runner.captured_buckets == DECODE_BUCKETS
    assert backend.probed == [] and runner.stats.estimate_bytes is None
    assert "will take" not in caplog.text


def test_an_engine_asked_for_the_estimate_logs_it_before_capturing(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="cudagraph"):
        engine, backend = started_engine(monkeypatch, log_capture_estimate=True)
    runner = engine.decode_cuda_graph_runner
    assert runner is not None and backend.probed == [16, 8, 2, 1]
    assert "decode CUDA graphs will take" in caplog.text
    assert runner.stats.estimate_bytes == runner.stats.bytes  # the capture reused it, and says so in its line


def test_an_engine_phase_with_a_budget_is_estimated_once_by_its_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """The capture plans a budget from the estimate itself: the engine need not (and does not) ask for it too."""
    engine, backend = started_engine(monkeypatch, MemoryBudget(bytes=512 * MiB))
    runner = engine.decode_cuda_graph_runner
    assert runner is not None and backend.probed == [16, 8, 2, 1]
    assert runner.stats.estimate_bytes == runner.stats.bytes


def test_a_model_that_does_not_trace_is_not_estimated_and_falls_back_to_eager(caplog) -> None:
    from cudagraph.backend import ModelTraceError

    class UntraceableBackend(CpuReplayBackend):
        def prepare(self, model_forward, entries) -> None:
            raise ModelTraceError("model_forward (model.py:12): graph break")

    model_runner = make_model_runner(config=decode_config())
    backend = UntraceableBackend(Backend.FULL, memory=MEMORY)
    runner = DecodeCudaGraphRunner(model_runner, decode_config(), backend=backend, show_progress=False)
    with caplog.at_level(logging.WARNING, logger="cudagraph.runner"):
        estimate = runner.estimate_capture_memory()
        runner.capture()
    assert estimate.total_bytes == 0 and "does not trace" in estimate.note and "not estimated" in str(estimate)
    assert caplog.text.count("every decode step runs eagerly") == 1
    assert backend.probed == [] and runner.eager_reason is not None


# -- the budget -----------------------------------------------------------------------------------------------------


def test_a_budget_captures_the_smallest_buckets_and_the_rest_run_eagerly(caplog) -> None:
    budget = MemoryBudget(bytes=30 * MiB)
    model_runner = make_model_runner(config=decode_config(budget))
    runner, backend = decode_runner(model_runner, budget)
    with caplog.at_level(logging.WARNING, logger="cudagraph.runner"):
        stats = runner.capture()
    fits = max(n for n in range(1, len(DECODE_BUCKETS) + 1) if simulated_total(list(DECODE_BUCKETS[:n])) <= 30 * MiB)
    assert runner.captured_buckets == DECODE_BUCKETS[:fits] and fits < len(DECODE_BUCKETS)
    assert backend.captured_order == sorted(runner.captured_buckets, reverse=True)
    assert stats.bytes == simulated_total(list(runner.captured_buckets)) <= 30 * MiB
    assert set(runner.skipped_buckets) == set(DECODE_BUCKETS[fits:]) == set(stats.skipped)
    for reason in runner.skipped_buckets.values():
        assert reason.startswith("over the 30MiB budget (estimate ")
    assert caplog.text.count("have no graph") == 1 and "over the 30MiB budget" in caplog.text
    # A batch whose bucket was skipped runs eagerly (counted as over budget) and gives the eager logits.
    too_big = decode_batch(model_runner, DECODE_BUCKETS[fits] - 1 if fits else 1, seed=2)
    route = runner.route(too_big)
    assert route.bucket is None and route.reason is EagerReason.OVER_BUDGET
    eager = model_runner.forward(too_big).clone()
    torch.testing.assert_close(runner.replay(too_big), eager)
    small = decode_batch(model_runner, 3, seed=3)
    eager_small = model_runner.forward(small).clone()
    torch.testing.assert_close(runner.replay(small), eager_small, rtol=1e-5, atol=1e-5)
    assert backend.replayed == [4]


def test_a_share_of_free_memory_is_a_budget_too() -> None:
    budget = MemoryBudget(free_fraction=0.02)  # of 1024 MiB free: 20.5 MiB
    model_runner = make_model_runner(config=decode_config(budget))
    runner, _ = decode_runner(model_runner, budget)
    stats = runner.capture()
    assert 0 < stats.bytes <= budget.limit_bytes(MEMORY.total_bytes)
    assert runner.captured_buckets == DECODE_BUCKETS[: len(runner.captured_buckets)]
    assert all(reason.startswith("over the 2% (= 20.5MiB) budget") for reason in runner.skipped_buckets.values())


def test_a_budget_smaller_than_any_graph_captures_nothing_and_gives_the_memory_back() -> None:
    budget = MemoryBudget(bytes=MiB)
    model_runner = make_model_runner(config=decode_config(budget))
    runner, backend = decode_runner(model_runner, budget)
    stats = runner.capture()
    assert runner.captured and runner.captured_buckets == () and set(runner.skipped_buckets) == set(DECODE_BUCKETS)
    assert stats.graphs == 0 and stats.bytes == 0 and used_bytes(backend) == 0
    batch = decode_batch(model_runner, 2)
    assert not runner.can_run(batch)
    torch.testing.assert_close(runner.replay(batch), model_runner.forward(batch))


def test_when_the_estimate_falls_short_the_running_capture_still_keeps_the_budget() -> None:
    """The estimate is made, then every graph turns out to cost six times as much: the guard releases the largest
    graphs to keep the smaller ones, and the capture ends within the budget, the buckets kept a prefix."""
    budget = MemoryBudget(bytes=40 * MiB)
    model_runner = make_model_runner(config=decode_config(budget))
    runner, backend = decode_runner(model_runner, budget)
    runner.estimate_capture_memory()
    backend.memory = dataclasses.replace(MEMORY, graph_bytes=6 * MiB, graph_bytes_per_row=6 * 64 * 1024)
    stats = runner.capture()
    assert stats.bytes <= 40 * MiB
    assert runner.captured_buckets == DECODE_BUCKETS[: len(runner.captured_buckets)]
    assert len(runner.captured_buckets) >= 1
    released = [b for b, reason in runner.skipped_buckets.items() if "released" in reason or "more needed" in reason]
    assert released, runner.skipped_buckets
    assert set(runner.captured_buckets) | set(runner.skipped_buckets) == set(DECODE_BUCKETS)
    assert list(backend.shapes) == list(runner.captured_buckets)
    for bucket in runner.skipped_buckets:
        assert runner.static_buckets[bucket].replay is None


# -- out of memory --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [Backend.FULL, Backend.BREAKABLE])
def test_an_out_of_memory_mid_capture_keeps_the_larger_graphs_and_skips_the_rest(kind: Backend, caplog) -> None:
    model_runner = make_model_runner(config=decode_config())
    runner, backend = decode_runner(model_runner, kind=kind, out_of_memory_shapes=(4,))
    with caplog.at_level(logging.WARNING, logger="cudagraph.runner"):
        stats = runner.capture()  # never raises
    assert runner.captured_buckets == (8, 12, 16) and list(backend.shapes) == [8, 12, 16]
    assert runner.skipped_buckets == {
        1: "not tried after CUDA ran out of memory capturing 4",
        2: "not tried after CUDA ran out of memory capturing 4",
        4: "CUDA out of memory while capturing",
    }
    assert stats.graphs == 3 and stats.bytes == simulated_total([8, 12, 16])
    assert "CUDA out of memory while capturing" in caplog.text
    for size, graphed in ((3, False), (5, True)):
        batch = decode_batch(model_runner, size, seed=size)
        assert runner.can_run(batch) is graphed
        eager = model_runner.forward(batch).clone()
        torch.testing.assert_close(runner.replay(batch), eager, rtol=1e-5, atol=1e-5)
    runner.shutdown()
    assert used_bytes(backend) == 0 and backend.entries == {}


def test_a_device_too_small_for_every_graph_captures_what_fits_and_never_raises() -> None:
    memory = dataclasses.replace(MEMORY, total_bytes=52 * MiB)  # 16 rows of activations (48 MiB) + one graph
    model_runner = make_model_runner(config=decode_config())
    runner, backend = decode_runner(model_runner, memory=memory)
    stats = runner.capture()
    assert runner.captured_buckets and runner.skipped_buckets
    assert list(backend.shapes) == list(runner.captured_buckets)
    assert stats.bytes <= memory.total_bytes
    assert "CUDA out of memory while capturing" in runner.skipped_buckets.values()


def test_a_largest_bucket_that_runs_out_of_memory_while_estimating_is_skipped() -> None:
    model_runner = make_model_runner(config=decode_config(MemoryBudget(bytes=512 * MiB)))
    runner, backend = decode_runner(model_runner, MemoryBudget(bytes=512 * MiB), out_of_memory_shapes=(16,))
    estimate = runner.estimate_capture_memory()
    assert estimate.out_of_memory == (16,) and estimate.buckets == (1, 2, 4, 8, 12)
    assert backend.probed == [12, 4, 2, 1]
    assert estimate.total_bytes == simulated_total([1, 2, 4, 8, 12])
    runner.capture()
    assert runner.skipped_buckets == {16: "CUDA out of memory while estimating"}
    assert runner.captured_buckets == (1, 2, 4, 8, 12) and backend.captured_order == [12, 8, 4, 2, 1]


def test_an_out_of_memory_in_a_smaller_probe_estimates_from_the_probes_that_fit() -> None:
    model_runner = make_model_runner(config=decode_config())
    runner, backend = decode_runner(model_runner, out_of_memory_shapes=(2,))
    estimate = runner.estimate_capture_memory()
    assert [probe.bucket for probe in estimate.probes] == [16, 8] and estimate.out_of_memory == ()
    assert estimate.buckets == DECODE_BUCKETS and backend.entries == {} and used_bytes(backend) == 0


def test_shutdown_after_an_out_of_memory_gives_every_byte_back_and_capture_works_again() -> None:
    model_runner = make_model_runner(config=decode_config())
    runner, backend = decode_runner(model_runner, out_of_memory_shapes=(12,))
    runner.capture()
    assert runner.captured_buckets == (16,)
    runner.shutdown()
    assert used_bytes(backend) == 0 and runner.skipped_buckets == {}
    backend.out_of_memory_shapes = frozenset()
    runner.capture()
    assert runner.captured_buckets == DECODE_BUCKETS and runner.skipped_buckets == {}


def test_prefill_out_of_memory_leaves_its_batches_to_eager() -> None:
    model_runner = make_model_runner(config=decode_config())
    backend = CpuReplayBackend(Backend.BREAKABLE, memory=MEMORY, out_of_memory_shapes=(32,))
    runner = PrefillCudaGraphRunner(model_runner, decode_config(), backend=backend, show_progress=False)
    runner.capture()
    assert runner.captured_buckets == (64,) and set(runner.skipped_buckets) == {16, 32}
    batch = make_extend_batch(admit(model_runner, prompts_of([5, 9])), model_runner.device)
    assert not runner.can_run(batch)
    torch.testing.assert_close(runner.replay(batch), model_runner.forward(batch))


def test_a_failed_capture_s_frames_let_go_of_what_they_held_even_while_the_error_is_kept() -> None:
    """An out-of-memory's traceback holds the failed forward's tensors; ``drop_failed_frames`` frees them, causes
    included, while the error itself is still referenced (as a logger or a caller may keep it)."""

    class Activations:
        pass

    held: list[weakref.ref[Activations]] = []

    def forward() -> None:
        activations = Activations()
        held.append(weakref.ref(activations))
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def capture() -> None:
        try:
            forward()
        except RuntimeError as cause:
            raise ValueError("capture of shape 32 failed") from cause

    try:
        capture()
    except ValueError as error:
        kept = error
    gc.collect()
    assert held[0]() is not None, "the traceback keeps the forward's locals alive"
    drop_failed_frames(kept)
    gc.collect()
    assert held[0]() is None
    assert isinstance(kept.__cause__, RuntimeError)  # the error itself is intact
