"""The tensor-parallel section's results on CPU: TP=1 ratios, compare, merge, targets, report, and the helpers the
ranks use (which sizes a machine can run, the all-reduce share of a profile)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from harness.compare import regressions
from harness.merge import merge_results
from harness.presets import preset_config
from harness.report import format_report
from harness.rows import BenchResult
from harness.targets import check_targets
from harness.tensor_parallel import ALL_REDUCE_KERNEL_WORDS, kernel_share, usable_sizes
from results_factory import TP_FULL_MS, large_tp_rows, sample_result, tp_rows, tp_start_rows


def _verdict(result: BenchResult, words: str) -> bool | None:
    return next(target.met for target in check_targets(result) if words in target.name)


def test_each_tp_row_is_divided_by_tp1_of_its_backend_and_by_raw_of_its_size() -> None:
    rows = {(row.tp_size, row.backend): row for row in tp_rows()}
    assert rows[(2, "full")].speedup_over_tp1 == pytest.approx(TP_FULL_MS[1] / TP_FULL_MS[2])
    assert rows[(4, "eager")].speedup_over_tp1 == pytest.approx(TP_FULL_MS[1] / TP_FULL_MS[4])
    assert rows[(1, "full")].speedup_over_tp1 == 1.0
    assert rows[(4, "full")].to_raw == pytest.approx(1 / 0.99)


def test_a_slower_tp2_step_is_a_regression_and_a_larger_tp4_graph_pool_too() -> None:
    old = sample_result()
    slow = tp_rows({1: TP_FULL_MS[1], 2: TP_FULL_MS[2] * 1.3, 4: TP_FULL_MS[4]})
    found = {regression.key for regression in regressions(old, dataclasses.replace(old, tp=slow))}
    assert "tp/llama-3-8b/tp2/full/auto/bs1/speedup_over_tp1" in found
    assert not any("tp4" in key for key in found)
    grown = tp_start_rows({1: 0.5, 2: 0.4, 4: 0.9})
    found = {regression.key for regression in regressions(old, dataclasses.replace(old, tp_start=grown))}
    assert found == {"tp_start/llama-3-8b/tp4/decode_graph_bytes_over_tp1"}


def test_merge_keeps_a_forced_path_beside_auto_and_takes_a_remeasured_row_from_the_later_run() -> None:
    first = sample_result()
    forced = dataclasses.replace(first.tp[4], all_reduce_choice="process-group", all_reduce="process-group")
    remeasured = dataclasses.replace(first.tp[4], step_ms=2.5)
    later = BenchResult(environment=first.environment, tp=[forced, remeasured])
    merged = merge_results([("a.json", first), ("b.json", later)])
    keys = [(row.preset, row.tp_size, row.backend, row.all_reduce_choice) for row in merged.tp]
    assert len(keys) == len(set(keys)) == len(first.tp) + 1
    assert [row.step_ms for row in merged.tp if row == remeasured] == [2.5]


def test_tp_targets_meet_on_the_sample_and_miss_on_slow_steps_grown_graphs_and_a_slow_start() -> None:
    result = sample_result()
    assert all(_verdict(result, words) for words in ("TP=4 >= 2.2x", "graph bytes per rank", "start-up"))
    slow = dataclasses.replace(result, tp=tp_rows({1: 4.5, 2: 3.5, 4: 1.9}))
    assert _verdict(slow, "TP=4 >= 2.2x") is False
    grown = dataclasses.replace(result, tp_start=tp_start_rows({1: 0.5, 2: 1.2, 4: 0.3}))
    assert _verdict(grown, "graph bytes per rank") is False
    late = dataclasses.replace(result, tp_start=tp_start_rows(seconds={1: 30.0, 2: 31.0, 4: 40.0}))
    assert _verdict(late, "start-up") is False
    no_tp4 = dataclasses.replace(result, tp=[row for row in result.tp if row.tp_size != 4])
    assert _verdict(no_tp4, "TP=4 >= 2.2x") is False  # a size of the target not measured is not met


def test_the_report_lists_every_tp_row_with_each_ranks_graph_memory() -> None:
    result = BenchResult(tp=tp_rows(), tp_start=tp_start_rows())
    text = format_report(result)
    assert "0.250/0.250/0.250/0.250" in text  # full's graphs on each of four ranks
    assert "0.400/0.400" in text  # TP=2's default decode graphs on each rank
    assert BenchResult.from_dict(json.loads(result.to_json())).tp == result.tp


def test_sizes_a_machine_or_the_heads_cannot_take_are_refused_with_the_reason() -> None:
    usable, refused = usable_sizes(preset_config("llama-3-8b"), (1, 2, 3, 4, 8), devices=4)
    assert usable == [1, 2, 4]
    assert "must divide num_attention_heads (32)" in refused[3] and refused[8] == "needs 8 GPUs, 4 visible"
    usable, _ = usable_sizes(preset_config("llama-3-70b"), (4, 8), devices=8)
    assert usable == [4, 8]


def test_the_all_reduce_share_counts_nccl_and_one_shot_kernels_only() -> None:
    kernels = [
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 30.0),
        ("void one_shot_all_reduce_kernel<bf16>", 10.0),
        ("gemv_kernel", 50.0),
        ("rms_norm", 10.0),
    ]
    assert kernel_share(kernels, ALL_REDUCE_KERNEL_WORDS) == 0.4
    assert kernel_share([], ALL_REDUCE_KERNEL_WORDS) is None


def _large_model(full_ms: dict[int, float], decode_gib: dict[int, float]) -> BenchResult:
    """The sample with its 70B shape's rows replaced: batch-1 and start-up rows at the sizes given."""
    result = sample_result()
    starts = tp_start_rows(decode_gib, dict.fromkeys(decode_gib, 30.0))
    return dataclasses.replace(
        result,
        tp=[*(row for row in result.tp if row.preset != "llama-3-70b"), *large_tp_rows(full_ms)],
        tp_start=[
            *(row for row in result.tp_start if row.preset != "llama-3-70b"),
            *(dataclasses.replace(row, preset="llama-3-70b") for row in starts),
        ],
    )


@pytest.mark.parametrize(("tp8_ms", "met"), [(12.9 / 1.7, True), (12.9 / 1.4, False)])
def test_the_70b_target_wants_tp8_1_6x_faster_than_tp4(tp8_ms: float, met: bool) -> None:
    result = _large_model({4: 12.9, 8: tp8_ms}, {4: 1.06, 8: 1.0})
    assert _verdict(result, "TP=8 >= 1.6x faster than TP=4") is met


def test_the_70b_target_is_not_measured_without_eight_gpus_and_its_graph_bytes_compare_with_tp4() -> None:
    tp4_only = _large_model({4: 12.9}, {4: 1.06})
    assert _verdict(tp4_only, "TP=8 >= 1.6x") is None  # a four-GPU machine's run: SKIP, not a miss
    grown = _large_model({4: 12.9, 8: 7.0}, {4: 1.06, 8: 1.2})
    [target] = [target for target in check_targets(grown) if "graph bytes per rank" in target.name]
    assert target.met is False and "llama-3-70b TP=8 1.200 GiB against TP=4 1.060 GiB" in target.detail
    assert _verdict(_large_model({4: 12.9, 8: 7.0}, {4: 1.06, 8: 1.0}), "graph bytes per rank") is True


def test_the_eight_gpu_presets_can_be_split_eight_ways() -> None:
    for preset in ("llama-3-70b", "qwen3-32b"):
        usable, refused = usable_sizes(preset_config(preset), (4, 8), devices=8)
        assert usable == [4, 8] and refused == {}


def test_the_start_up_table_shows_the_head_gather_buffer_per_rank_apart_from_the_graphs() -> None:
    rows = [
        dataclasses.replace(row, head_gather_bytes_per_rank=[row.tp_size * 2**26] * row.tp_size)
        for row in tp_start_rows()
    ]
    result = BenchResult(tp_start=rows)
    text = format_report(result)
    assert "head gather buffer GiB per rank" in text
    assert "0.125/0.125" in text  # TP=2: 128 MiB on each of two ranks
    assert BenchResult.from_dict(json.loads(result.to_json())).tp_start == rows
