"""A small ``BenchResult`` with rows of every kind, for the CPU tests of compare, report, JSON and targets."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from harness.rows import (
    BenchResult,
    BreakRow,
    CaptureRow,
    CompileRow,
    DecodeRow,
    DraftRow,
    LifecycleRow,
    MigrationRow,
    PrefillRow,
    SkippedRow,
    SleepRow,
    SpeculativeRow,
    TensorParallelRow,
    TensorParallelStartRow,
    WrongAnswer,
    with_ratios,
    with_tensor_parallel_ratios,
)
from harness.targets import Target, check_targets

DECODE_STEP_MS = {"eager": 30.0, "raw": 2.0, "full": 2.02, "breakable": 3.0, "torch.compile": 3.6}


def decode_rows(step_ms: dict[str, float] | None = None, batch_sizes: tuple[int, ...] = (1, 8)) -> list[DecodeRow]:
    steps = step_ms or DECODE_STEP_MS
    rows = [
        DecodeRow("qwen3-0.6b", backend, batch_size, ms * (1 + batch_size / 100), 50.0, 500.0, 0.4)
        for backend, ms in steps.items()
        for batch_size in batch_sizes
    ]
    return with_ratios(rows)


def draft_rows(graph_slower: float = 1.0, capture_slower: float = 1.0) -> list[DraftRow]:
    """EAGLE draft rounds at batch 1, k = 3 and 5 (graphed ``graph_slower`` times longer, draft capture
    ``capture_slower``)."""
    rows = []
    for k, eager_ms, graph_ms, capture_s, per_step in ((3, 6.0, 1.0, 1.2, 3.9), (5, 10.0, 1.6, 1.6, 5.8)):
        graph, capture = graph_ms * graph_slower, capture_s * capture_slower
        rows.append(DraftRow("qwen3-0.6b", "triton", 1, k, eager_ms, graph, 5000.0, 40.0, 3, capture, 2.4, per_step))
    return rows


def speculative_rows(graph_slower: float = 1.0) -> list[SpeculativeRow]:
    """A verify step at batch 1 and 8 (k = 3) and a mixed 8+48 step; graphed steps ``graph_slower`` times longer."""
    return [
        SpeculativeRow("verify", "qwen3-0.6b", "triton", 1, 4, 3, 12.0, 2.0 * graph_slower, 4000.0, 60.0),
        SpeculativeRow("verify", "qwen3-0.6b", "triton", 8, 32, 3, 13.0, 2.6 * graph_slower, 4100.0, 62.0),
        SpeculativeRow("mixed", "qwen3-0.6b", "triton", 9, 56, None, 14.0, 5.0 * graph_slower, 4300.0, 900.0),
    ]


TP_FULL_MS = {1: 4.5, 2: 2.8, 4: 1.9}
"""Batch-1 ``full`` step of the 8B shape by tensor-parallel size (TP=2 1.61x, TP=4 2.37x faster than TP=1)."""


def tp_rows(full_ms: dict[int, float] | None = None) -> list[TensorParallelRow]:
    """Raw, full and eager rows of the 8B shape at TP=1, 2, 4, batch 1 (auto all-reduce), ratios filled in."""
    steps = full_ms or TP_FULL_MS
    rows = []
    for size, ms in steps.items():
        choice, path = ("none", "none") if size == 1 else ("auto", "symm-mem")
        for backend, factor in (("raw", 0.99), ("full", 1.0), ("eager", 5.0)):
            graph = [2**28] * size if backend == "full" else None
            rows.append(
                TensorParallelRow("llama-3-8b", size, backend, 1, choice, path, ms * factor, 12.0, graph, 1.5, None)
            )
    return with_tensor_parallel_ratios(rows)


LARGE_TP_FULL_MS = {4: 12.9, 8: 7.6}
"""Batch-1 ``full`` steps of the 70B shape at TP=4 and 8 (TP=8 1.7x faster: its target met)."""


def large_tp_rows(full_ms: dict[int, float] | None = None) -> list[TensorParallelRow]:
    """The 70B shape's raw, full and eager rows at TP=4 and 8, batch 1 (it has no TP=1: it needs four GPUs)."""
    rows = [row for row in tp_rows({1: 99.0, **(full_ms or LARGE_TP_FULL_MS)}) if row.tp_size > 1]
    return [dataclasses.replace(row, preset="llama-3-70b", speedup_over_tp1=None) for row in rows]


def tp_start_rows(
    decode_gib: dict[int, float] | None = None, seconds: dict[int, float] | None = None
) -> list[TensorParallelStartRow]:
    """Start-up rows of the 8B shape at TP=1, 2, 4: decode graph GiB on every rank and seconds to first token."""
    gib = decode_gib or {1: 0.5, 2: 0.4, 4: 0.35}
    took = seconds or {1: 30.0, 2: 31.0, 4: 33.0}
    return [
        TensorParallelStartRow(
            "llama-3-8b",
            size,
            "none" if size == 1 else "symm-mem",
            took[size],
            10.0,
            3.0,
            35,
            [int(gib[size] * 2**30)] * size,
            32,
            [2**27] * size,
        )
        for size in gib
    ]


def lifecycle_rows(**changes: object) -> list[LifecycleRow]:
    """One row per lifecycle preset, every target met (the 2026-11-28 H100 figures, the byte share made up), with
    ``changes`` applied to both."""
    figures = (("qwen3-0.6b", 1.67, 94.2, 0.60, 1226.0), ("llama-3-8b", 3.12, 95.2, 0.62, 6199.0))
    rows = [
        LifecycleRow(
            preset, "full", 35, {"eager": eager_s, "lazy": 0.12}, first_use_ms, 0.65, 7 * 2**30, int(6.9 * 2**30),
            wake_s, wake_s + 0.01, replay_us, replay_us * 0.99, [],
        )
        for preset, eager_s, first_use_ms, wake_s, replay_us in figures
    ]  # fmt: skip
    return [dataclasses.replace(row, **changes) for row in rows]  # type: ignore[arg-type]


def sleep_rows(**changes: object) -> list[SleepRow]:
    """One row per sleep level of the qwen3-0.6b shape, every sleep target met (figures made up, of a plausible
    size), with ``changes`` applied to each."""
    gib = 2**30
    rows = [
        SleepRow("qwen3-0.6b", "full", 0, 35, 0.65, 7 * gib, int(7.05 * gib), int(1.2 * gib), 50e9, 0.004, 0.002,
                 0.004, 0),
        SleepRow("qwen3-0.6b", "full", 1, 35, 0.65, int(8.2 * gib), int(8.3 * gib), int(1.2 * gib), 50e9, 0.1, 0.03,
                 0.032, 0),
        SleepRow("qwen3-0.6b", "full", 2, 35, 0.65, int(8.2 * gib), int(8.3 * gib), int(1.2 * gib), 50e9, 0.004,
                 0.003, 0.05, 0),
    ]  # fmt: skip
    return [dataclasses.replace(row, **changes) for row in rows]  # type: ignore[arg-type]


def sample_result() -> BenchResult:
    result = BenchResult(environment={"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-23"}, settings={"x": 1})
    result.decode = decode_rows()
    result.breaks = [
        BreakRow("ours", "model", 16, 6.0, 5.0, 1.0),
        BreakRow("breakable-cuda-graphs", "model", 16, 10.0, 9.0, 1.1),
        BreakRow("piecewise-cuda-graphs", "model", 16, 9.0, 8.0, 1.1),
    ]
    result.prefill = [
        PrefillRow("qwen3-0.6b", "eager", 1, 64, 30.0, 9000.0, 1.0),
        PrefillRow("qwen3-0.6b", "breakable", 1, 64, 10.0, 3000.0, 3.0),
    ]
    result.speculative = speculative_rows()
    result.draft = draft_rows()
    result.capture = [CaptureRow("qwen3-0.6b", "decode", "full", 35, 2.5, 3 * 2**28)]
    result.compile = [CompileRow("qwen3-0.6b", "inductor", 40.0, 8.0, 45.0, 10.0)]
    result.migration = [MigrationRow("generated-10", 10, 1, 2.0, 0, 0), MigrationRow("generated-10", 10, 4, 1.0, 0, 0)]
    result.tp = [*tp_rows(), *large_tp_rows()]
    large_start = tp_start_rows({4: 1.06, 8: 1.0}, {4: 32.0, 8: 30.0})
    result.tp_start = [*tp_start_rows(), *(dataclasses.replace(row, preset="llama-3-70b") for row in large_start)]
    result.lifecycle = lifecycle_rows()
    result.sleep = sleep_rows()
    result.skipped = [SkippedRow("decode", "qwen3-0.6b full+compiled", "the config rejects it")]
    result.wrong = [WrongAnswer("decode", "qwen3-0.6b x bs 8", "3 of 8 greedy tokens wrong")]
    return result


def result_with(**sections: list[Any]) -> BenchResult:
    """``sample_result()`` with the named sections' rows replaced, e.g. ``result_with(sleep=rows)``."""
    return dataclasses.replace(sample_result(), **sections)


def json_round_trip(result: BenchResult) -> BenchResult:
    """``result`` written as JSON and read back, as ``compare`` and ``merge`` read a stored run."""
    return BenchResult.from_dict(json.loads(result.to_json()))


def target_verdicts(result: BenchResult, targets: tuple[Target, ...]) -> list[bool | None]:
    """Whether ``result`` meets each of ``targets`` (``None``: nothing to judge it on)."""
    return [target.met for target in check_targets(result, targets)]


def scaled(result: BenchResult, backend: str, factor: float) -> BenchResult:
    """A copy of ``result`` whose ``backend`` decode steps take ``factor`` times as long (ratios recomputed)."""
    rows = [
        dataclasses.replace(row, step_ms=row.step_ms * factor, to_raw=None, to_eager=None)
        if row.backend == backend
        else dataclasses.replace(row, to_raw=None, to_eager=None)
        for row in result.decode
    ]
    return dataclasses.replace(result, decode=with_ratios(rows))
