"""The engine's decode timing (``harness.engine_timing``): what the host-cost figures derive, how they print, the
profile of a loop, and eager timings on a CPU."""

from __future__ import annotations

import pytest
import torch
from harness.engine_timing import (
    HostCost,
    format_host_costs,
    format_table,
    measure_host_costs,
    profile_host,
    run_decode_bench,
)

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
from cudagraph.engine.model import model_config_from_preset, random_model
from cudagraph.engine.model_runner import ModelRunner
from cudagraph.runner import DecodeCudaGraphRunner

EAGER = CudaGraphConfig(PhaseConfig(Backend.DISABLED, (), 0), PhaseConfig(Backend.DISABLED, (), 0))


def test_per_break_cost_is_the_breakable_excess_over_full_per_break() -> None:
    cost = HostCost(
        batch_size=1, raw_us=6.0, full_us=14.0, full_in_place_us=9.0, breakable_us=238.0, breaks=28, device_waited=False
    )
    assert cost.runner_over_raw_us == pytest.approx(8.0)
    assert cost.in_place_over_raw_us == pytest.approx(3.0)
    assert cost.per_break_us == pytest.approx(8.0)
    row = cost.as_dict()
    assert row["per_break_us"] == pytest.approx(8.0) and row["runner_over_raw_us"] == pytest.approx(8.0)
    assert row["breaks"] == 28


def test_a_graph_without_breaks_has_no_per_break_cost_and_waits_are_flagged() -> None:
    cost = HostCost(
        batch_size=4, raw_us=6.0, full_us=9.0, full_in_place_us=7.5, breakable_us=9.5, breaks=0, device_waited=True
    )
    assert cost.per_break_us == 0.0
    table = format_host_costs([cost])
    assert table.splitlines()[1].startswith("4 | 6.0 | 9.0 | 7.5 | 9.5 | 0 | 3.0 | 1.5 | 0.00")
    assert "waited on the device" in table


def test_host_costs_need_a_cuda_model() -> None:
    class CpuModelRunner:
        device = torch.device("cpu")

    with pytest.raises(ValueError, match="around CUDA graph replays"):
        measure_host_costs(CpuModelRunner(), [1])  # type: ignore[arg-type]


def test_profile_host_reports_the_functions_of_the_loop() -> None:
    def a_distinctively_named_step() -> None:
        torch.ones(4).add_(1)

    report = profile_host(a_distinctively_named_step, torch.device("cpu"), steps=30, top=10)
    step_line = next(line for line in report.splitlines() if "a_distinctively_named_step" in line)
    assert step_line.split()[0] == "30", "the 30 profiled steps are counted, the warm-up calls are not"


def test_eager_decode_steps_are_timed_on_a_cpu() -> None:
    """What ``cudagraph-engine bench`` did on a CPU before it moved here: eager steps at each batch size, nothing
    captured."""
    model = random_model(model_config_from_preset("tiny-llama-random"), seed=0, device="cpu")
    model_runner = ModelRunner(model, EAGER)
    try:
        bench = run_decode_bench(model_runner, [1, 3], ["eager"], context_len=8, steps=2)
    finally:
        model_runner.shutdown()
    assert [(t.mode, t.batch_size) for t in bench.timings] == [("eager", 1), ("eager", 3)]
    assert all(t.step_ms > 0 for t in bench.timings) and bench.captures == []
    assert "eager ms" in format_table(bench.timings)


def test_a_graphed_mode_that_captured_nothing_is_not_timed_under_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``full`` runner that captures no bucket (here: the CPU double runs out of memory on every one) would run
    every step eagerly: the bench says why and reports no ``full`` row, since an eager step under a graph backend's
    name would read as a graph's time."""
    from harness import engine_timing

    def runner_that_captures_nothing(model_runner, config, **options):
        backend = CpuReplayBackend(Backend.FULL, out_of_memory_shapes=list(config.decode.buckets))
        return DecodeCudaGraphRunner(model_runner, config, backend=backend, **options)

    monkeypatch.setattr(engine_timing, "DecodeCudaGraphRunner", runner_that_captures_nothing)
    model = random_model(model_config_from_preset("tiny-llama-random"), seed=0, device="cpu")
    model_runner = ModelRunner(model, EAGER)
    try:
        bench = run_decode_bench(model_runner, [1, 3], ["eager", "full"], context_len=8, steps=2)
    finally:
        model_runner.shutdown()
    assert [(t.mode, t.batch_size) for t in bench.timings] == [("eager", 1), ("eager", 3)]
    assert list(bench.graphs_off) == ["full"] and bench.graphs_off["full"]
