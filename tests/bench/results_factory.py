"""A small ``BenchResult`` with rows of every kind, for the CPU tests of compare, report, JSON and targets."""

from __future__ import annotations

import dataclasses

from harness.rows import (
    BenchResult,
    BreakRow,
    CaptureRow,
    CompileRow,
    DecodeRow,
    MigrationRow,
    PrefillRow,
    SkippedRow,
    SpeculativeRow,
    WrongAnswer,
    with_ratios,
)

DECODE_STEP_MS = {"eager": 30.0, "raw": 2.0, "full": 2.02, "breakable": 3.0, "torch.compile": 3.6}


def decode_rows(step_ms: dict[str, float] | None = None, batch_sizes: tuple[int, ...] = (1, 8)) -> list[DecodeRow]:
    steps = step_ms or DECODE_STEP_MS
    rows = [
        DecodeRow("qwen3-0.6b", backend, batch_size, ms * (1 + batch_size / 100), 50.0, 500.0, 0.4)
        for backend, ms in steps.items()
        for batch_size in batch_sizes
    ]
    return with_ratios(rows)


def speculative_rows(graph_slower: float = 1.0) -> list[SpeculativeRow]:
    """A verify step at batch 1 and 8 (k = 3) and a mixed 8+48 step; graphed steps ``graph_slower`` times longer."""
    return [
        SpeculativeRow("verify", "qwen3-0.6b", "triton", 1, 4, 3, 12.0, 2.0 * graph_slower, 4000.0, 60.0),
        SpeculativeRow("verify", "qwen3-0.6b", "triton", 8, 32, 3, 13.0, 2.6 * graph_slower, 4100.0, 62.0),
        SpeculativeRow("mixed", "qwen3-0.6b", "triton", 9, 56, None, 14.0, 5.0 * graph_slower, 4300.0, 900.0),
    ]


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
    result.capture = [CaptureRow("qwen3-0.6b", "decode", "full", 35, 2.5, 3 * 2**28)]
    result.compile = [CompileRow("qwen3-0.6b", "inductor", 40.0, 8.0, 45.0, 10.0)]
    result.migration = [MigrationRow("generated-10", 10, 1, 2.0, 0, 0), MigrationRow("generated-10", 10, 4, 1.0, 0, 0)]
    result.skipped = [SkippedRow("decode", "qwen3-0.6b full+compiled", "the config rejects it")]
    result.wrong = [WrongAnswer("decode", "qwen3-0.6b x bs 8", "3 of 8 greedy tokens wrong")]
    return result


def scaled(result: BenchResult, backend: str, factor: float) -> BenchResult:
    """A copy of ``result`` whose ``backend`` decode steps take ``factor`` times as long (ratios recomputed)."""
    rows = [
        dataclasses.replace(row, step_ms=row.step_ms * factor, to_raw=None, to_eager=None)
        if row.backend == backend
        else dataclasses.replace(row, to_raw=None, to_eager=None)
        for row in result.decode
    ]
    return dataclasses.replace(result, decode=with_ratios(rows))
