"""Capture on first use (``CapturePolicy.LAZY``): nothing at start-up, the first step routed to a bucket captures and
replays it, later steps replay; the memory budget and the ranks' agreement still decide which buckets get graphs."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from runner_helpers import StubModelRunner, make_model_runner, stub_decode_batch
from test_runner_memory import MEMORY, MiB, decode_batch, simulated_total

from cudagraph.backend.testing import CpuReplayBackend, SimulatedDeviceMemory
from cudagraph.backend_utils import CaptureOptions
from cudagraph.config import Backend, CapturePolicy, CudaGraphConfig, MemoryBudget, PhaseConfig
from cudagraph.runner import DecodeCudaGraphRunner, EagerReason
from cudagraph.runner.agreement import ANOTHER_RANK_HAS_NO_ROOM, ANOTHER_RANK_RAN_OUT
from cudagraph.runner.memory_plan import OUT_OF_MEMORY_WHILE_CAPTURING

BUCKETS = (1, 2, 4, 8)


def lazy_config(
    buckets: tuple[int, ...] = BUCKETS,
    budget: MemoryBudget | None = None,
    policy: CapturePolicy = CapturePolicy.LAZY,
) -> CudaGraphConfig:
    return CudaGraphConfig(
        decode=PhaseConfig(Backend.FULL, buckets, max(buckets), memory_budget=budget, capture_policy=policy),
        prefill=PhaseConfig(Backend.BREAKABLE, (16, 32), 32),
    )


def lazy_runner(
    model_runner: object = None,
    config: CudaGraphConfig | None = None,
    kind: Backend = Backend.FULL,
    *,
    memory: SimulatedDeviceMemory | None = None,
    out_of_memory_shapes: tuple[int, ...] = (),
    barrier: object = None,
    debug: bool = False,
) -> tuple[DecodeCudaGraphRunner, CpuReplayBackend]:
    model_runner = model_runner if model_runner is not None else StubModelRunner()
    options = CaptureOptions(barrier=barrier, debug=debug)  # type: ignore[arg-type]
    backend = CpuReplayBackend(kind, options=options, memory=memory, out_of_memory_shapes=out_of_memory_shapes)
    runner = DecodeCudaGraphRunner(model_runner, config or lazy_config(), backend=backend, show_progress=False)
    runner.capture()
    return runner, backend


@pytest.mark.parametrize("kind", [Backend.FULL, Backend.BREAKABLE])
def test_start_up_captures_nothing_and_the_first_step_captures_its_bucket_and_replays_it(kind: Backend) -> None:
    model_runner = StubModelRunner()
    runner, backend = lazy_runner(model_runner, kind=kind)
    assert backend.captured_order == [] and runner.captured_buckets == ()
    assert runner.route(stub_decode_batch(3)).bucket == 4  # routed to its (pending) bucket
    for step, size in enumerate([3, 3, 1, 4, 7, 3]):
        batch = stub_decode_batch(size, seed=step)
        eager = model_runner.forward(batch).clone()
        torch.testing.assert_close(runner.replay(batch), eager)
    # Each bucket captured once, by its first step, in the order steps reached them; every step replayed.
    assert backend.captured_order == [4, 1, 8]
    assert backend.replayed == [4, 4, 1, 4, 8, 4]
    assert runner.captured_buckets == (1, 4, 8) and 2 not in backend.shapes
    assert runner.metrics.replays == 6 and runner.metrics.eager == 0
    assert runner.metrics.lazy_captures == 3 and runner.metrics.lazy_capture_seconds > 0
    assert runner.metrics.to_dict()["lazy_captures"] == 3
    assert "captured on first use 3" in runner.metrics.table()


def test_the_eager_policy_still_captures_every_bucket_at_start_up() -> None:
    runner, backend = lazy_runner(config=lazy_config(policy=CapturePolicy.EAGER))
    assert backend.captured_order == [8, 4, 2, 1] and runner.static_buckets.pending == set()
    runner.replay(stub_decode_batch(3))
    assert runner.metrics.lazy_captures == 0 and backend.captured_order == [8, 4, 2, 1]


def test_sizes_no_bucket_holds_still_run_eagerly_and_capture_nothing() -> None:
    runner, backend = lazy_runner()
    batch = stub_decode_batch(9)
    assert runner.route(batch).reason is EagerReason.TOO_LARGE
    runner.replay(batch)
    assert backend.captured_order == [] and runner.metrics.eager_count(EagerReason.TOO_LARGE) == 1


def test_input_views_wait_for_the_capture_then_write_in_place() -> None:
    """A pending bucket is captured over padding rows, so its first step must bring its own tensors."""
    model_runner = StubModelRunner()
    runner, _ = lazy_runner(model_runner)
    assert runner.input_views(3) is None
    runner.replay(stub_decode_batch(3))
    views = runner.input_views(3)
    assert views is not None and views["input_ids"].data_ptr() == runner.static_buffers.tensors["input_ids"].data_ptr()


def test_the_capture_runs_over_padding_rows_whatever_an_earlier_step_left() -> None:
    """A smaller bucket captured after a larger one replayed sees padding, not the larger step's live rows."""
    model_runner = StubModelRunner()
    runner, backend = lazy_runner(model_runner, kind=Backend.BREAKABLE)
    runner.replay(stub_decode_batch(8, seed=1))
    assert bool((runner.static_buffers.tensors["input_ids"] != 0).any())  # the step's live rows are still there
    seen: list[torch.Tensor] = []
    capture_one = backend.capture_one

    def capture_seeing_the_buffers(shape, forward_fn, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(runner.static_buffers.tensors["input_ids"].clone())
        return capture_one(shape, forward_fn, **kwargs)

    backend.capture_one = capture_seeing_the_buffers  # type: ignore[method-assign]
    batch = stub_decode_batch(2, seed=2)
    eager = model_runner.forward(batch).clone()
    torch.testing.assert_close(runner.replay(batch), eager)
    assert len(seen) == 1 and bool((seen[0] == 0).all()), seen  # token 0: the padding id


def test_a_bucket_that_would_exceed_the_budget_stays_eager_with_its_reason(caplog) -> None:
    """The plan fits every bucket by the estimate; then graphs turn out to cost twelve times as much, and the first
    use of the largest finds no room: it stays eager, its steps route over budget and give the eager logits."""
    budget = MemoryBudget(bytes=64 * MiB)
    buckets = (1, 2, 4, 8, 12)
    model_runner = make_model_runner(config=lazy_config(buckets, budget), max_num_reqs=48)
    backend = CpuReplayBackend(Backend.FULL, memory=MEMORY)
    runner = DecodeCudaGraphRunner(model_runner, lazy_config(buckets, budget), backend=backend, show_progress=False)
    runner.estimate_capture_memory()
    assert simulated_total(list(buckets)) <= 64 * MiB  # the plan keeps them all
    backend.memory = dataclasses.replace(MEMORY, graph_bytes=12 * MiB, graph_bytes_per_row=0)
    runner.capture()
    assert runner.static_buckets.pending == set(buckets)
    kept: list[int] = []
    with caplog.at_level(logging.WARNING, logger="cudagraph.runner"):
        for size in (1, 2, 4, 8, 12):
            batch = decode_batch(model_runner, size, seed=size)
            eager = model_runner.forward(batch).clone()
            torch.testing.assert_close(runner.replay(batch), eager, rtol=1e-5, atol=1e-5)
            if backend.has_shape(size):
                kept.append(size)
    used = MEMORY.total_bytes - backend.memory_reading().free_bytes
    assert used <= 64 * MiB
    assert kept and len(kept) < len(buckets) and runner.captured_buckets == tuple(kept)
    skipped = {bucket: reason for bucket, reason in runner.skipped_buckets.items()}
    assert set(skipped) == set(buckets) - set(kept)
    for reason in skipped.values():
        assert reason.startswith("over the 64MiB budget"), reason
    assert "stays eager" in caplog.text
    # Later steps of a skipped bucket run eagerly, routed over budget, and never try to capture again.
    attempts = runner.metrics.lazy_captures
    later = decode_batch(model_runner, max(skipped), seed=99)
    assert runner.route(later).reason is EagerReason.OVER_BUDGET
    torch.testing.assert_close(runner.replay(later), model_runner.forward(later).clone(), rtol=1e-5, atol=1e-5)
    assert runner.metrics.lazy_captures == attempts
    assert runner.metrics.eager_count(EagerReason.OVER_BUDGET) >= 1


def test_a_capture_that_runs_out_of_memory_leaves_its_bucket_eager_and_the_others_captured() -> None:
    model_runner = StubModelRunner()
    runner, backend = lazy_runner(model_runner, out_of_memory_shapes=(4,))
    batch = stub_decode_batch(3)
    torch.testing.assert_close(runner.replay(batch), model_runner.forward(batch).clone())
    assert runner.skipped_buckets == {4: OUT_OF_MEMORY_WHILE_CAPTURING} and not backend.has_shape(4)
    assert runner.route(batch).reason is EagerReason.OVER_BUDGET
    runner.replay(stub_decode_batch(8))
    assert runner.captured_buckets == (8,) and backend.replayed == [8]


def test_a_capture_that_fails_otherwise_leaves_its_bucket_eager_with_the_error_and_the_step_runs() -> None:
    model_runner = StubModelRunner()
    runner, backend = lazy_runner(model_runner)
    capture_one = backend.capture_one

    def failing(shape, forward_fn, **kwargs):  # type: ignore[no-untyped-def]
        if shape == 2:
            raise RuntimeError("operation not permitted when stream is capturing")
        return capture_one(shape, forward_fn, **kwargs)

    backend.capture_one = failing  # type: ignore[method-assign]
    for seed in range(2):
        batch = stub_decode_batch(2, seed=seed)
        torch.testing.assert_close(runner.replay(batch), model_runner.forward(batch).clone())
    assert runner.skipped_buckets == {
        2: "its capture failed on first use: operation not permitted when stream is capturing"
    }
    assert runner.metrics.lazy_captures == 1 and runner.metrics.eager_count(EagerReason.OVER_BUDGET) == 2
    runner.replay(stub_decode_batch(4))
    assert runner.captured_buckets == (4,)


class ScriptedGroup:
    """A tensor-parallel group of this rank and one other, whose answers are scripted: the other rank's value for
    each ``agree_min`` call, in order (1 where the script runs out)."""

    def __init__(self, other_rank: list[int]) -> None:
        self.other_rank = list(other_rank)
        self.calls: list[list[int]] = []

    def __call__(self) -> None:
        pass

    def agree_min(self, values: list[int]) -> list[int]:
        self.calls.append(list(values))
        theirs = self.other_rank.pop(0) if self.other_rank else 1
        return [min(value, theirs) for value in values]


def test_a_bucket_another_rank_has_no_room_for_stays_eager_here_too() -> None:
    model_runner = StubModelRunner()
    group = ScriptedGroup([])
    runner, backend = lazy_runner(model_runner, barrier=group)
    plan_calls = len(group.calls)
    group.other_rank = [0]  # the other rank's first decision of the next step: no room
    batch = stub_decode_batch(3)
    torch.testing.assert_close(runner.replay(batch), model_runner.forward(batch).clone())
    assert runner.skipped_buckets == {4: ANOTHER_RANK_HAS_NO_ROOM} and backend.captured_order == []
    assert len(group.calls) == plan_calls + 1  # one decision shared, nothing captured
    runner.replay(stub_decode_batch(1))  # the next bucket: both ranks agree
    assert runner.captured_buckets == (1,)
    assert len(group.calls) == plan_calls + 3  # fits, then captured without running out of memory


def test_a_bucket_another_rank_ran_out_capturing_is_released_here() -> None:
    model_runner = StubModelRunner()
    group = ScriptedGroup([])
    runner, backend = lazy_runner(model_runner, barrier=group)
    group.other_rank = [1, 0]  # fits everywhere, then the other rank ran out of memory capturing it
    batch = stub_decode_batch(3)
    torch.testing.assert_close(runner.replay(batch), model_runner.forward(batch).clone())
    assert backend.captured_order == [4] and not backend.has_shape(4)
    assert runner.skipped_buckets == {4: ANOTHER_RANK_RAN_OUT}
    assert runner.static_buckets[4].replay is None and 4 not in runner.graph_inputs.recorded


def test_shutdown_forgets_pending_buckets_and_capture_plans_them_again() -> None:
    runner, backend = lazy_runner()
    runner.replay(stub_decode_batch(3))
    runner.shutdown()
    assert runner.static_buckets.pending == set()
    assert runner.route(stub_decode_batch(3)).reason is EagerReason.NOT_CAPTURED
    runner.capture()
    assert runner.static_buckets.pending == set(BUCKETS) and backend.entries == {}


def test_a_first_use_capture_walks_no_full_collection_inside_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The start-up loop collects everything once before capturing; a bucket captured by a step must not (a full
    collection in a process holding the compiler stack is about 0.1 s of that step)."""
    import gc

    runner, backend = lazy_runner()
    generations: list[int] = []
    real_collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda generation=2: generations.append(generation) or real_collect(generation))
    runner.replay(stub_decode_batch(3))
    assert backend.captured_order == [4]
    assert 2 not in generations and generations, "the young generations are still collected after the capture"
