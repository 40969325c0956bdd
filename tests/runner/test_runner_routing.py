"""One decision per step: the route table against a reference of its rules, and runners routing by it."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from runner_helpers import StubModelRunner, make_model_runner, stub_decode_batch

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.config import Backend, ConfigError, CudaGraphConfig, PhaseConfig
from cudagraph.runner import (
    DecodeCudaGraphRunner,
    EagerReason,
    ForwardBatch,
    ForwardMode,
    PrefillCudaGraphRunner,
    Route,
    RouteTable,
)

DISABLED = PhaseConfig(Backend.DISABLED, (), 0)


def expected_route(
    size: int, buckets: list[int], captured: set[int], disable_padding: bool, ratio: float | None
) -> tuple[int | None, EagerReason | None]:
    """The rules, written out as a plain cascade over a linear scan of the buckets."""
    if size > buckets[-1]:
        return None, EagerReason.TOO_LARGE
    wanted = max(size, 1)
    holding = [b for b in buckets if (b == wanted if disable_padding else b >= wanted)]
    if not holding:
        return None, EagerReason.NOT_A_BUCKET
    bucket = holding[0]
    if bucket not in captured:
        return None, EagerReason.OVER_BUDGET
    if ratio is not None and size > 0 and bucket > ratio * size:
        return None, EagerReason.OVER_PADDED
    return bucket, None


bucket_lists = st.lists(st.integers(1, 64), min_size=1, max_size=8, unique=True).map(sorted)
ratios = st.one_of(st.none(), st.sampled_from([1.0, 1.5, 2.0, 4.0]), st.floats(1.0, 8.0))


@given(bucket_lists, st.data(), st.booleans(), ratios)
def test_every_size_routes_as_the_rules_say(
    buckets: list[int], data: st.DataObject, disable_padding: bool, ratio: float | None
) -> None:
    kept = data.draw(st.lists(st.booleans(), min_size=len(buckets), max_size=len(buckets)), label="captured mask")
    captured = {bucket for bucket, keep in zip(buckets, kept, strict=True) if keep}
    table = RouteTable.build(buckets, sorted(captured), disable_padding=disable_padding, max_padding_ratio=ratio)
    for size in range(buckets[-1] + 4):
        route = table.of_size(size)
        assert (route.bucket, route.reason) == expected_route(size, buckets, captured, disable_padding, ratio), size
        assert route.replays is (route.bucket is not None)
    assert table.wrong_mode.reason is EagerReason.MODE_NOT_GRAPHABLE


@given(bucket_lists)
def test_a_captured_bucket_is_one_shared_route_with_its_request_rows(buckets: list[int]) -> None:
    table = RouteTable.build(buckets, buckets, requests_of=lambda bucket: bucket // 2 + 1)
    routes = {id(route): route for route in table.by_size}
    assert sorted(route.bucket for route in routes.values() if route.bucket is not None) == buckets
    assert all(route.requests == route.bucket // 2 + 1 for route in routes.values() if route.bucket is not None)
    assert Route.eager(EagerReason.TOO_LARGE) is table.beyond


@pytest.mark.parametrize(
    ("buckets", "captured", "error"),
    [([], [], "ascending distinct positive"), ([4, 2], [2], "ascending"), ([1, 2], [3], "not all configured")],
)
def test_a_table_of_impossible_buckets_is_refused(buckets: list[int], captured: list[int], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        RouteTable.build(buckets, captured)


@pytest.mark.parametrize("ratio", [0.5, 0.999, math.nan, -1.0])
def test_a_padding_ratio_below_one_is_one_clear_error_of_the_config(ratio: float) -> None:
    # The config's one rule (read_padding_ratio), with infinity admitted as no limit; the runner trusts it.
    expected = f"max_padding_ratio: {ratio!r} is not allowed; allowed: a number >= 1, e.g. 1.5 .*, or inf"
    with pytest.raises(ConfigError, match=expected):
        PhaseConfig(Backend.FULL, (1, 2), 2, max_padding_ratio=ratio)


@pytest.mark.parametrize(("ratio", "checked"), [(None, None), (1, 1.0), (1.5, 1.5), (math.inf, math.inf)])
def test_no_limit_and_ratios_of_at_least_one_are_admitted(ratio: float | None, checked: float | None) -> None:
    config = CudaGraphConfig(decode=PhaseConfig(Backend.FULL, (1, 2), 2, max_padding_ratio=ratio), prefill=DISABLED)
    runner = DecodeCudaGraphRunner(StubModelRunner(), config, backend=CpuReplayBackend(), show_progress=False)
    assert runner.max_padding_ratio == checked


def stub_runner(
    buckets: tuple[int, ...] = (1, 2, 4, 8), ratio: float | None = None, *, disable_padding: bool = False
) -> tuple[DecodeCudaGraphRunner, CpuReplayBackend, StubModelRunner]:
    model_runner = StubModelRunner()
    config = CudaGraphConfig(
        decode=PhaseConfig(Backend.FULL, buckets, max(buckets), max_padding_ratio=ratio),
        prefill=DISABLED,
        disable_padding=disable_padding,
    )
    backend = CpuReplayBackend(Backend.FULL)
    runner = DecodeCudaGraphRunner(model_runner, config, backend=backend, show_progress=False)
    return runner, backend, model_runner


# Decode buckets 1, 2, 4, 8 and max_padding_ratio 1.5: where each batch size 0..10 goes.
PADDING_CASES = [
    (0, 1, None),  # idle: replays the smallest bucket, never over-padded
    (1, 1, None),
    (2, 2, None),
    (3, 4, None),  # 4 / 3 = 1.33
    (4, 4, None),
    (5, None, EagerReason.OVER_PADDED),  # 8 / 5 = 1.6
    (6, 8, None),
    (7, 8, None),
    (8, 8, None),
    (9, None, EagerReason.TOO_LARGE),
    (10, None, EagerReason.TOO_LARGE),
]


def test_the_padding_policy_sends_a_batch_eager_exactly_when_its_ratio_is_exceeded() -> None:
    runner, backend, model_runner = stub_runner(ratio=1.5)
    runner.capture()
    for size, bucket, reason in PADDING_CASES:
        mode = ForwardMode.IDLE if size == 0 else ForwardMode.DECODE
        batch = stub_decode_batch(size, seed=size, mode=mode)
        route = runner.route(batch)
        assert (route.bucket, route.reason) == (bucket, reason), f"batch size {size}"
        assert runner.can_run(batch) is (bucket is not None)
        backend.replayed.clear()
        calls = model_runner.forward_calls
        logits = runner.replay(batch, route)
        assert backend.replayed == ([bucket] if bucket is not None else [])
        assert model_runner.forward_calls - calls == 1, "a replay reruns the recorded forward once, eager runs it once"
        if size:
            torch.testing.assert_close(logits, model_runner.forward(batch))
    metrics = runner.metrics
    assert metrics.steps == len(PADDING_CASES)
    assert metrics.eager_count(EagerReason.OVER_PADDED) == 1 and metrics.eager_count(EagerReason.TOO_LARGE) == 2
    assert metrics.replays == len(PADDING_CASES) - 3


def test_routes_before_capture_after_shutdown_and_for_other_modes() -> None:
    runner, backend, _ = stub_runner()
    batch = stub_decode_batch(3)
    assert runner.route(batch).reason is EagerReason.NOT_CAPTURED
    assert runner.route(stub_decode_batch(20)).reason is EagerReason.NOT_CAPTURED
    runner.capture()
    assert runner.route(batch).bucket == 4
    extend = ForwardBatch(**{**vars(batch), "forward_mode": ForwardMode.EXTEND})
    assert runner.route(extend).reason is EagerReason.MODE_NOT_GRAPHABLE
    runner.shutdown()
    assert runner.route(batch).reason is EagerReason.NOT_CAPTURED
    runner.replay(batch)
    assert backend.replayed == [] and runner.metrics.eager_count(EagerReason.NOT_CAPTURED) == 1


def test_a_runner_that_fell_back_to_eager_routes_every_step_there() -> None:
    from cudagraph.backend import ModelTraceError

    class UntraceableBackend(CpuReplayBackend):
        def prepare(self, model_forward: object, entries: object) -> None:
            raise ModelTraceError("graph break")

    config = CudaGraphConfig(decode=PhaseConfig(Backend.FULL, (1, 2), 2), prefill=DISABLED)
    runner = DecodeCudaGraphRunner(StubModelRunner(), config, backend=UntraceableBackend(), show_progress=False)
    runner.capture()
    assert runner.route(stub_decode_batch(1)).reason is EagerReason.EAGER_FALLBACK


def test_without_padding_only_exact_buckets_replay() -> None:
    runner, _, _ = stub_runner(disable_padding=True)
    runner.capture()
    reasons = {size: runner.route(stub_decode_batch(size)).reason for size in range(1, 10)}
    assert [size for size, reason in reasons.items() if reason is None] == [1, 2, 4, 8]
    assert {reasons[size] for size in (3, 5, 6, 7)} == {EagerReason.NOT_A_BUCKET}
    assert reasons[9] is EagerReason.TOO_LARGE


def test_buckets_a_budget_left_without_graphs_route_over_budget() -> None:
    # What a capture stopped by a memory budget leaves: graphs of a prefix (1, 2), the larger buckets without one.
    table = RouteTable.build((1, 2, 4, 8), (1, 2))
    reasons = [table.by_size[size].reason for size in range(1, 9)] + [table.beyond.reason]
    assert reasons == [None, None, *[EagerReason.OVER_BUDGET] * 6, EagerReason.TOO_LARGE]
    assert [table.by_size[size].bucket for size in (1, 2)] == [1, 2]


step_sizes = st.lists(st.integers(0, 12), min_size=1, max_size=40)


bucket_ratios = st.sampled_from([None, 1.0, 1.5, 2.0])


@settings(max_examples=10)
@given(step_sizes, bucket_ratios, st.booleans())
def test_metrics_count_exactly_the_steps_each_route_took(sizes: list[int], ratio: float | None, padding: bool) -> None:
    count_routes(sizes, ratio, padding)


@pytest.mark.slow
@settings(max_examples=40)
@given(step_sizes, bucket_ratios, st.booleans())
def test_metrics_count_exactly_the_steps_each_route_took_over_more_runs(
    sizes: list[int], ratio: float | None, padding: bool
) -> None:
    """The same property searched four times longer (``nox -s slow``): each run captures its runner."""
    count_routes(sizes, ratio, padding)


def count_routes(sizes: list[int], ratio: float | None, padding: bool) -> None:
    """Route and replay ``sizes`` as steps of a runner capturing buckets 1, 2, 4 and 8: its metrics count each
    replayed bucket's steps and each eager reason's, and every step once."""
    runner, backend, _ = stub_runner((1, 2, 4, 8), ratio, disable_padding=not padding)
    runner.capture()
    want_eager: Counter[EagerReason] = Counter()
    want_replays: Counter[int] = Counter()
    for step, size in enumerate(sizes):
        batch = stub_decode_batch(size, seed=step, mode=ForwardMode.IDLE if size == 0 else ForwardMode.DECODE)
        route = runner.route(batch)
        if route.bucket is None:
            assert route.reason is not None
            want_eager[route.reason] += 1
        else:
            want_replays[route.bucket] += 1
        runner.replay(batch, route)
    metrics = runner.metrics
    assert Counter(backend.replayed) == want_replays
    assert {row.bucket: row.replays for row in metrics.bucket_rows() if row.replays} == dict(want_replays)
    assert {row.reason: row.steps for row in metrics.eager_rows()} == dict(want_eager)
    assert metrics.steps == len(sizes)


def test_the_prefill_runner_routes_by_tokens_and_request_rows() -> None:
    model_runner = make_model_runner(max_num_reqs=16)
    runner = PrefillCudaGraphRunner(
        model_runner, model_runner.cuda_graph_config, backend=CpuReplayBackend(Backend.BREAKABLE), show_progress=False
    )
    runner.capture()

    def extend(tokens: int, requests: int) -> ForwardBatch:
        ids = torch.zeros(tokens, dtype=torch.int64)
        rows = torch.zeros(requests, dtype=torch.int64)
        return ForwardBatch(ForwardMode.EXTEND, requests, ids, ids, rows.int(), rows, ids, 0)

    assert runner.route(extend(20, 2)).bucket == 32
    assert runner.route(extend(65, 2)).reason is EagerReason.TOO_LARGE
    too_many = runner.requests_per_graph(16) + 1
    assert runner.route(extend(16, too_many)).reason is EagerReason.TOO_MANY_REQUESTS
    decode = ForwardBatch(**{**vars(extend(4, 4)), "forward_mode": ForwardMode.DECODE})
    assert runner.route(decode).reason is EagerReason.MODE_NOT_GRAPHABLE


def test_the_engine_takes_the_runners_route_once_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ModelRunner.run`` decides nothing itself: it hands the batch to ``replay``, whose one rule (the route given,
    else carried on the batch, else looked up) asks ``route`` once (no ``can_run``, no second bucket lookup),
    whether the step replays or runs eagerly."""
    model_runner = make_model_runner()
    runner = DecodeCudaGraphRunner(
        model_runner, model_runner.cuda_graph_config, backend=CpuReplayBackend(), show_progress=False
    )
    runner.capture()
    model_runner.decode_cuda_graph_runner = runner
    routed: list[Route] = []
    route, replay = runner.route, runner.replay

    def counting_route(batch: ForwardBatch) -> Route:
        routed.append(route(batch))
        return routed[-1]

    def counting_replay(batch: ForwardBatch, given: Route | None = None) -> torch.Tensor:
        assert given is None and batch.route is None, "the engine looked a route up itself"
        return replay(batch, given)

    def no_second_decision(batch: ForwardBatch) -> bool:
        raise AssertionError("the engine asked can_run besides route")

    monkeypatch.setattr(runner, "route", counting_route)
    monkeypatch.setattr(runner, "replay", counting_replay)
    monkeypatch.setattr(runner, "can_run", no_second_decision)
    for size in (3, 9):  # 3 replays bucket 4; 9 is larger than the largest bucket (8)
        model_runner.run(stub_decode_batch_of(model_runner, size))
    assert [r.bucket for r in routed] == [4, None]
    assert runner.metrics.replays == 1 and runner.metrics.eager_count(EagerReason.TOO_LARGE) == 1


def stub_decode_batch_of(model_runner, size: int) -> ForwardBatch:
    """A decode batch of ``size`` requests over rows and slots the engine's cache has (contents arbitrary)."""
    rows = torch.arange(1, size + 1)
    seq_lens = torch.full((size,), 4, dtype=torch.int32)
    return ForwardBatch(
        ForwardMode.DECODE,
        size,
        torch.arange(size),
        torch.full((size,), 3),
        seq_lens,
        rows,
        rows + 1,
        4 * size,
        seq_lens,
    )
