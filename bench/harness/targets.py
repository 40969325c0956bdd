"""The stated targets (``--check``): each is a named predicate over a result. A target whose figures were not
measured prints as ``SKIP`` with the reason (a run of other sections is not a miss), and ``--check`` still counts it
against the run, so a partial run cannot pass a check it did not make."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .rows import BenchResult

FULL_OVER_RAW_LIMIT = 1.03
"""Our ``full`` runner may be at most this much slower than a raw ``CUDAGraph.replay``, at every batch size."""


@dataclass(frozen=True)
class TargetResult:
    """One target: met or not, and the figures that decided it."""

    name: str
    met: bool | None
    """``None``: not measured in this run (``detail`` says what is missing)."""
    detail: str

    def __str__(self) -> str:
        verdict = {True: "MET ", False: "MISS", None: "SKIP"}[self.met]
        return f"{verdict}  {self.name}: {self.detail}"


def _full_within_raw(result: BenchResult) -> tuple[bool | None, str]:
    rows = [row for row in result.decode if row.backend == "full" and row.to_raw is not None]
    if not rows:
        return None, "not measured (no decode rows of full with a raw reference)"
    worst = max(rows, key=lambda row: row.to_raw or 0.0)
    assert worst.to_raw is not None
    return worst.to_raw <= FULL_OVER_RAW_LIMIT, f"worst {worst.to_raw:.3f}x ({worst.preset}, batch {worst.batch_size})"


def _breaks_below_peers(result: BenchResult) -> tuple[bool | None, str]:
    rows = {row.implementation: row for row in result.breaks if row.workload == "model"}
    ours = rows.pop("ours", None)
    if ours is None or not rows:
        return None, "not measured (needs ours and at least one peer on the model workload)"
    shown = ", ".join(f"{name} {row.host_us_per_break:.1f} us" for name, row in sorted(rows.items()))
    met = all(ours.host_us_per_break < row.host_us_per_break for row in rows.values())
    return met, f"ours {ours.host_us_per_break:.1f} us per break; {shown}"


def _full_beats_reduce_overhead_at_batch_1(result: BenchResult) -> tuple[bool | None, str]:
    by_key = {(row.preset, row.backend): row for row in result.decode if row.batch_size == 1}
    pairs = [
        (preset, full, by_key[(preset, "torch.compile")])
        for (preset, backend), full in by_key.items()
        if backend == "full" and (preset, "torch.compile") in by_key
    ]
    if not pairs:
        return None, "not measured (needs full and torch.compile rows at batch 1)"
    met = all(full.step_ms <= compiled.step_ms for _, full, compiled in pairs)
    shown = "; ".join(
        f"{preset}: full {full.step_ms:.3f} ms, torch.compile {compiled.step_ms:.3f} ms"
        for preset, full, compiled in pairs
    )
    return met, shown


TARGETS: tuple[tuple[str, Callable[[BenchResult], tuple[bool | None, str]]], ...] = (
    (f"decode full <= {FULL_OVER_RAW_LIMIT}x raw replay at every batch size", _full_within_raw),
    ("breakable host cost per break below both peers'", _breaks_below_peers),
    ("batch-1 decode full <= torch.compile(mode='reduce-overhead')", _full_beats_reduce_overhead_at_batch_1),
)
"""(name, predicate) for every stated target."""


def check_targets(result: BenchResult) -> list[TargetResult]:
    """Every target, met, missed or not measured, with its figures."""
    return [TargetResult(name, *predicate(result)) for name, predicate in TARGETS]
