"""``compare OLD.json NEW.json``: every ratio of a run, keyed so two runs line up, and the ones that got worse.

Only ratios are compared (a configuration against a reference measured in the same run), never absolute times:
those move with the machine's noise, ratios much less. Each ratio knows which direction is better.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .rows import BenchResult

DEFAULT_TOLERANCE = 0.10
"""A ratio that got more than this much worse (relative) is a regression."""


@dataclass(frozen=True)
class Ratio:
    """One ratio of a run: its key, its value, and whether a larger value is better."""

    key: str
    value: float
    higher_is_better: bool
    reference: str | None = None
    """The row the ratio divides by (``raw``, ``eager``), when it is a row of the same table."""
    reference_ms: float | None = None
    """That row's own step time in this run."""


@dataclass(frozen=True)
class Regression:
    """A ratio that got worse by more than the tolerance between two runs."""

    key: str
    old: float
    new: float
    note: str = ""
    """Why it may not be this row's doing (its reference row got faster by more than the tolerance)."""

    @property
    def change(self) -> float:
        """Relative change of the value, new over old, minus one."""
        return self.new / self.old - 1.0

    def __str__(self) -> str:
        note = f"; {self.note}" if self.note else ""
        return f"{self.key}: {self.old:.4g} -> {self.new:.4g} ({self.change:+.1%}){note}"


def _decode_ratios(result: BenchResult) -> Iterator[Ratio]:
    step_ms = {(row.preset, row.backend, row.batch_size): row.step_ms for row in result.decode}
    for row in result.decode:
        key = f"decode/{row.preset}/{row.backend}/bs{row.batch_size}"
        raw_ms, eager_ms = (step_ms.get((row.preset, name, row.batch_size)) for name in ("raw", "eager"))
        if row.to_raw is not None and row.backend != "raw":
            yield Ratio(f"{key}/to_raw", row.to_raw, higher_is_better=False, reference="raw", reference_ms=raw_ms)
        if row.to_eager is not None and row.backend != "eager":
            yield Ratio(f"{key}/to_eager", row.to_eager, False, reference="eager", reference_ms=eager_ms)
        yield Ratio(f"{key}/floor_fraction", row.floor_fraction, higher_is_better=True)


def _break_ratios(result: BenchResult) -> Iterator[Ratio]:
    ours = {row.workload: row for row in result.breaks if row.implementation == "ours"}
    for row in result.breaks:
        reference = ours.get(row.workload)
        if row.implementation == "ours" or reference is None or row.host_us_per_break <= 0:
            continue
        yield Ratio(
            f"breaks/{row.workload}/ours_over_{row.implementation}",
            reference.host_us_per_break / row.host_us_per_break,
            higher_is_better=False,
        )


def _prefill_ratios(result: BenchResult) -> Iterator[Ratio]:
    for row in result.prefill:
        if row.speedup is not None and row.backend != "eager":
            key = f"prefill/{row.preset}/{row.backend}/{row.requests}x{row.tokens_per_request}/speedup"
            yield Ratio(key, row.speedup, higher_is_better=True)


def _speculative_ratios(result: BenchResult) -> Iterator[Ratio]:
    for row in result.speculative:
        if row.graph_ms > 0:
            key = f"speculative/{row.preset}/{row.kind}/{row.shape}/speedup"
            yield Ratio(key, row.speedup, higher_is_better=True)


def _draft_ratios(result: BenchResult) -> Iterator[Ratio]:
    for row in result.draft:
        key = f"speculative/{row.preset}/draft/{row.requests}xk{row.drafts}"
        if row.graph_ms > 0:
            yield Ratio(f"{key}/speedup", row.speedup, higher_is_better=True)
        if row.decode_capture_s > 0:
            yield Ratio(f"{key}/capture_over_decode", row.capture_ratio, higher_is_better=False)


def _migration_ratios(result: BenchResult) -> Iterator[Ratio]:
    for row in result.migration:
        single = next((r for r in result.migration if r.tree == row.tree and r.jobs == 1), None)
        if single is not None and row.jobs > 1 and row.seconds > 0:
            yield Ratio(f"migration/{row.tree}/j{row.jobs}_speedup", single.seconds / row.seconds, True)


def _tensor_parallel_ratios(result: BenchResult) -> Iterator[Ratio]:
    tp1_ms = {(row.preset, row.backend, row.batch_size): row.step_ms for row in result.tp if row.tp_size == 1}
    for row in result.tp:
        key = f"tp/{row.preset}/tp{row.tp_size}/{row.backend}/{row.all_reduce_choice}/bs{row.batch_size}"
        if row.speedup_over_tp1 is not None and row.tp_size > 1:
            yield Ratio(
                f"{key}/speedup_over_tp1",
                row.speedup_over_tp1,
                higher_is_better=True,
                reference="TP=1",
                reference_ms=tp1_ms.get((row.preset, row.backend, row.batch_size)),
            )
        if row.to_raw is not None and row.backend != "raw":
            yield Ratio(f"{key}/to_raw", row.to_raw, higher_is_better=False)
    tp1_start = {row.preset: row for row in result.tp_start if row.tp_size == 1}
    for row in result.tp_start:
        single = tp1_start.get(row.preset)
        if single is None or row.tp_size == 1:
            continue
        key = f"tp_start/{row.preset}/tp{row.tp_size}"
        if single.largest_decode_graph_bytes > 0:
            ratio = row.largest_decode_graph_bytes / single.largest_decode_graph_bytes
            yield Ratio(f"{key}/decode_graph_bytes_over_tp1", ratio, higher_is_better=False)
        if single.startup_seconds > 0:
            yield Ratio(f"{key}/startup_over_tp1", row.startup_seconds / single.startup_seconds, False)


LIFECYCLE_RATIOS = (
    ("lazy_over_eager", False),
    ("freed_share", True),
    ("wake_over_first_capture", False),
    ("after_over_before", False),
)
"""``LifecycleRow`` ratio -> whether a larger value is better."""


def _named_ratios(
    rows: Iterable[Any], names: tuple[tuple[str, bool], ...], key: Callable[[Any], str]
) -> Iterator[Ratio]:
    """Each ``(name, higher_is_better)`` ratio property a row measured, under ``key(row)/name``."""
    for row in rows:
        for name, higher_is_better in names:
            value = getattr(row, name)
            if value is not None:
                yield Ratio(f"{key(row)}/{name}", value, higher_is_better)


def _lifecycle_ratios(result: BenchResult) -> Iterator[Ratio]:
    return _named_ratios(result.lifecycle, LIFECYCLE_RATIOS, lambda row: f"lifecycle/{row.preset}/{row.backend}")


SLEEP_RATIOS = (
    ("freed_share", True),
    ("wake_over_first_capture", False),
    ("wake_over_weight_copy", False),
)
"""``SleepRow`` ratio -> whether a larger value is better."""


def _sleep_ratios(result: BenchResult) -> Iterator[Ratio]:
    return _named_ratios(result.sleep, SLEEP_RATIOS, lambda row: f"sleep/{row.preset}/{row.backend}/level{row.level}")


RATIO_SOURCES = (
    _decode_ratios,
    _break_ratios,
    _prefill_ratios,
    _speculative_ratios,
    _draft_ratios,
    _migration_ratios,
    _tensor_parallel_ratios,
    _lifecycle_ratios,
    _sleep_ratios,
)
"""Every section that contributes ratios."""


def ratios_of(result: BenchResult) -> dict[str, Ratio]:
    """Every ratio of ``result`` by key."""
    return {ratio.key: ratio for source in RATIO_SOURCES for ratio in source(result)}


def is_regression(old: Ratio, new: Ratio, tolerance: float = DEFAULT_TOLERANCE) -> bool:
    """Whether ``new`` is more than ``tolerance`` worse than ``old`` (relative to ``old``)."""
    if old.value <= 0 or new.value <= 0:
        return False
    worse_by = old.value / new.value if old.higher_is_better else new.value / old.value
    return worse_by > 1.0 + tolerance


def reference_note(old: Ratio, new: Ratio, tolerance: float = DEFAULT_TOLERANCE) -> str:
    """Says so when the row a ratio divides by got more than ``tolerance`` faster: the ratio then reads worse even
    if the row itself did not move (an absolute comparison, meaningful on the same machine only)."""
    before, after = old.reference_ms, new.reference_ms
    if not before or not after or before / after <= 1.0 + tolerance:
        return ""
    return f"the {new.reference} step itself went {before:.3f} -> {after:.3f} ms"


def regressions(old: BenchResult, new: BenchResult, tolerance: float = DEFAULT_TOLERANCE) -> list[Regression]:
    """Every ratio present in both runs that got more than ``tolerance`` worse, in key order (with a note where its
    reference row got faster)."""
    old_ratios, new_ratios = ratios_of(old), ratios_of(new)
    return [
        Regression(
            key,
            old_ratios[key].value,
            new_ratios[key].value,
            reference_note(old_ratios[key], new_ratios[key], tolerance),
        )
        for key in sorted(old_ratios.keys() & new_ratios.keys())
        if is_regression(old_ratios[key], new_ratios[key], tolerance)
    ]


def compare_report(old: BenchResult, new: BenchResult, tolerance: float = DEFAULT_TOLERANCE) -> tuple[str, bool]:
    """The text ``compare`` prints, and whether any ratio regressed."""
    old_ratios, new_ratios = ratios_of(old), ratios_of(new)
    found = regressions(old, new, tolerance)
    lines = [f"{len(old_ratios.keys() & new_ratios.keys())} ratios in both runs, tolerance {tolerance:.0%}"]
    only_old, only_new = sorted(old_ratios.keys() - new_ratios.keys()), sorted(new_ratios.keys() - old_ratios.keys())
    if only_old:
        lines.append(f"{len(only_old)} only in the old run (not compared), e.g. {only_old[0]}")
    if only_new:
        lines.append(f"{len(only_new)} only in the new run (not compared), e.g. {only_new[0]}")
    lines += [f"WORSE  {regression}" for regression in found] or ["no ratio got more than the tolerance worse"]
    return "\n".join(lines), bool(found)
