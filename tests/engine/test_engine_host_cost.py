"""The host-cost figures of the engine benchmark: what they derive, how they print, and the profile of a loop."""

from __future__ import annotations

import pytest
import torch

from cudagraph.engine.benchmark import HostCost, format_host_costs, measure_host_costs, profile_host


def test_per_break_cost_is_the_breakable_excess_over_full_per_break() -> None:
    cost = HostCost(batch_size=1, raw_us=6.0, full_us=14.0, breakable_us=238.0, breaks=28, device_waited=False)
    assert cost.runner_over_raw_us == pytest.approx(8.0)
    assert cost.per_break_us == pytest.approx(8.0)
    row = cost.as_dict()
    assert row["per_break_us"] == pytest.approx(8.0) and row["runner_over_raw_us"] == pytest.approx(8.0)
    assert row["breaks"] == 28


def test_a_graph_without_breaks_has_no_per_break_cost_and_waits_are_flagged() -> None:
    cost = HostCost(batch_size=4, raw_us=6.0, full_us=9.0, breakable_us=9.5, breaks=0, device_waited=True)
    assert cost.per_break_us == 0.0
    table = format_host_costs([cost])
    assert table.splitlines()[1].startswith("4 | 6.0 | 9.0 | 9.5 | 0 | 3.0 | 0.00")
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
