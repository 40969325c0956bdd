"""The stated targets (``--check``): each is a named predicate over a result. A target whose figures were not
measured prints as ``SKIP`` with the reason (a run of other sections is not a miss), and ``--check`` still counts it
against the run, so a partial run cannot pass a check it did not make."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .rows import BenchResult, LifecycleRow, SleepRow, TensorParallelStartRow

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


TP_PRESET = "llama-3-8b"
"""The model the tensor-parallel targets are stated for."""

TP_SPEEDUP_TARGETS = {2: 1.5, 4: 2.2}
"""Tensor-parallel size -> how much faster than TP=1 its batch-1 ``full`` decode step must be (Llama-3-8B shape)."""

TP_STARTUP_LIMIT = 1.2
"""Start-up to first token at TP=4 may take at most this multiple of TP=1's (8B shape, capture included)."""


def _batch_one_full_steps(result: BenchResult, preset: str) -> dict[int, float]:
    """Tensor-parallel size -> ``preset``'s batch-1 ``full`` decode step (ms), with the all-reduce chosen as usual."""
    return {
        row.tp_size: row.step_ms
        for row in result.tp
        if row.preset == preset
        and row.backend == "full"
        and row.batch_size == 1
        and row.all_reduce_choice in ("auto", "none")
    }


def _speedups_over(steps: dict[int, float], base: int, wanted: dict[int, float]) -> tuple[bool, str]:
    """Whether each size of ``wanted`` is at least its factor faster than ``base`` (a size not measured misses)."""
    met, shown = True, []
    for size, factor in wanted.items():
        if size not in steps:
            shown.append(f"TP={size} not measured")
            met = False
            continue
        speedup = steps[base] / steps[size]
        met = met and speedup >= factor
        shown.append(f"TP={size} {speedup:.2f}x (wanted {factor}x; {steps[size]:.3f} ms)")
    return met, f"TP={base} {steps[base]:.3f} ms; " + ", ".join(shown)


def _tp_speedups(result: BenchResult) -> tuple[bool | None, str]:
    steps = _batch_one_full_steps(result, TP_PRESET)
    if 1 not in steps or not any(size in steps for size in TP_SPEEDUP_TARGETS):
        return None, f"not measured (needs {TP_PRESET} full batch-1 rows at TP=1 and TP=2 or 4)"
    return _speedups_over(steps, 1, TP_SPEEDUP_TARGETS)


LARGE_TP_PRESET = "llama-3-70b"
"""The model the eight-GPU target is stated for (too large for one GPU: its base is TP=4)."""

LARGE_TP_SPEEDUP = 1.6
"""How much faster the large model's batch-1 ``full`` step must be at TP=8 than at TP=4."""


def _large_tp_speedup(result: BenchResult) -> tuple[bool | None, str]:
    steps = _batch_one_full_steps(result, LARGE_TP_PRESET)
    if 4 not in steps or 8 not in steps:
        return None, f"not measured (needs {LARGE_TP_PRESET} full batch-1 rows at TP=4 and TP=8)"
    return _speedups_over(steps, 4, {8: LARGE_TP_SPEEDUP})


def _tp_graph_bytes(result: BenchResult) -> tuple[bool | None, str]:
    smallest: dict[str, TensorParallelStartRow] = {}
    for row in result.tp_start:
        if row.preset not in smallest or row.tp_size < smallest[row.preset].tp_size:
            smallest[row.preset] = row
    pairs = [(row, smallest[row.preset]) for row in result.tp_start if row.tp_size > smallest[row.preset].tp_size]
    if not pairs:
        return None, "not measured (needs tp start-up rows of one preset at two sizes)"
    met = all(row.largest_decode_graph_bytes <= base.largest_decode_graph_bytes for row, base in pairs)
    shown = "; ".join(
        f"{row.preset} TP={row.tp_size} {row.largest_decode_graph_bytes / 2**30:.3f} GiB against TP={base.tp_size} "
        f"{base.largest_decode_graph_bytes / 2**30:.3f} GiB"
        for row, base in pairs
    )
    return met, f"decode graphs of the default buckets, largest rank: {shown}"


def _tp_startup(result: BenchResult) -> tuple[bool | None, str]:
    rows = {row.tp_size: row for row in result.tp_start if row.preset == TP_PRESET}
    if 1 not in rows or 4 not in rows:
        return None, f"not measured (needs {TP_PRESET} start-up at TP=1 and TP=4)"
    ratio = rows[4].startup_seconds / rows[1].startup_seconds
    return ratio <= TP_STARTUP_LIMIT, (
        f"TP=4 {rows[4].startup_seconds:.1f} s against TP=1 {rows[1].startup_seconds:.1f} s ({ratio:.2f}x)"
    )


LAZY_STARTUP_LIMIT = 0.25
"""Start-up to first token under the ``lazy`` capture policy may take at most this share of ``eager``'s."""

FIRST_USE_CAPTURE_LIMIT_MS = 100.0
"""A decode bucket's capture by its first step (after the engine's first step) may take at most this long."""

SLEEP_FREED_SHARE = 0.95
"""``sleep()`` must give back at least this share of the graphs' and KV cache's bytes."""

WAKE_OVER_FIRST_CAPTURE_LIMIT = 1.0
"""``wake()`` and the first replayed step may take at most this multiple of the first capture of every bucket."""

UPDATE_REPLAY_TOLERANCE = 0.05
"""A replay after an in-place weight update must be within this share of the replay before it."""


def _lifecycle_target(
    result: BenchResult, value: Callable[[LifecycleRow], float | None], met: Callable[[float], bool], unit: str
) -> tuple[bool | None, str]:
    """Met when ``met`` holds for ``value`` of every lifecycle row that measured it."""
    measured = [(row, value(row)) for row in result.lifecycle]
    shown = [(row, figure) for row, figure in measured if figure is not None]
    if not shown:
        return None, "not measured (no lifecycle rows with the figures)"
    text = "; ".join(f"{row.preset} {row.backend} {unit.format(figure)}" for row, figure in shown)
    return all(met(figure) for _, figure in shown), text


def _lazy_startup(result: BenchResult) -> tuple[bool | None, str]:
    return _lifecycle_target(
        result, lambda row: row.lazy_over_eager, lambda ratio: ratio <= LAZY_STARTUP_LIMIT, "{:.3f}x eager's"
    )


def _first_use_capture(result: BenchResult) -> tuple[bool | None, str]:
    return _lifecycle_target(
        result, lambda row: row.first_use_capture_ms, lambda ms: ms <= FIRST_USE_CAPTURE_LIMIT_MS, "{:.1f} ms"
    )


def _sleep_frees(result: BenchResult) -> tuple[bool | None, str]:
    return _lifecycle_target(
        result, lambda row: row.freed_share, lambda share: share >= SLEEP_FREED_SHARE, "{:.1%} freed"
    )


def _wake_within_first_capture(result: BenchResult) -> tuple[bool | None, str]:
    return _lifecycle_target(
        result,
        lambda row: row.wake_over_first_capture,
        lambda ratio: ratio <= WAKE_OVER_FIRST_CAPTURE_LIMIT,
        "{:.3f}x the first capture",
    )


def _replay_after_update(result: BenchResult) -> tuple[bool | None, str]:
    met, text = _lifecycle_target(
        result,
        lambda row: row.after_over_before,
        lambda ratio: abs(ratio - 1.0) <= UPDATE_REPLAY_TOLERANCE,
        "{:.3f}x before",
    )
    recaptured = [f"{row.preset} captured {row.recaptured} again" for row in result.lifecycle if row.recaptured]
    if met is None or not recaptured:
        return met, text
    return False, f"{text}; " + "; ".join(recaptured)


KEPT_WAKE_OVER_FIRST_CAPTURE_LIMIT = 0.1
"""With sleep mode, a wake and the first replay may take at most this multiple of the first capture (level 0)."""

LEVEL_1_WAKE_OVER_WEIGHT_COPY_LIMIT = 1.5
"""Level 1's wake may take at most this multiple of copying the weights host to device at the measured rate."""


def _sleep_target(
    result: BenchResult,
    levels: tuple[int, ...],
    value: Callable[[SleepRow], float | None],
    met: Callable[[float], bool],
    unit: str,
) -> tuple[bool | None, str]:
    """Met when ``met`` holds for ``value`` of every sleep row of ``levels`` and none captured a bucket again."""
    shown = [(row, value(row)) for row in result.sleep if row.level in levels]
    shown = [(row, figure) for row, figure in shown if figure is not None]
    if not shown:
        return None, "not measured (no sleep-mode rows of that level; the skipped table says why)"
    text = "; ".join(f"{row.preset} level {row.level} {unit.format(figure)}" for row, figure in shown)
    again = [
        f"{row.preset} level {row.level} captured {row.captured_again} again" for row, _ in shown if row.captured_again
    ]
    return all(met(figure) for _, figure in shown) and not again, "; ".join([text, *again])


def _kept_sleep_frees(result: BenchResult) -> tuple[bool | None, str]:
    return _sleep_target(
        result, (0, 1, 2), lambda row: row.freed_share, lambda share: share >= SLEEP_FREED_SHARE, "{:.1%} freed"
    )


def _kept_wake(result: BenchResult) -> tuple[bool | None, str]:
    return _sleep_target(
        result,
        (0,),
        lambda row: row.wake_over_first_capture,
        lambda ratio: ratio <= KEPT_WAKE_OVER_FIRST_CAPTURE_LIMIT,
        "{:.4f}x the first capture",
    )


def _level_1_wake(result: BenchResult) -> tuple[bool | None, str]:
    return _sleep_target(
        result,
        (1,),
        lambda row: row.wake_over_weight_copy,
        lambda ratio: ratio <= LEVEL_1_WAKE_OVER_WEIGHT_COPY_LIMIT,
        "{:.2f}x the weights' copy",
    )


def _level_2_wake(result: BenchResult) -> tuple[bool | None, str]:
    return _sleep_target(
        result, (2,), lambda row: row.wake_and_first_replay_s, lambda seconds: True, "{:.3f} s with the load"
    )


Target = tuple[str, Callable[[BenchResult], tuple[bool | None, str]]]
"""(name, predicate): the predicate says met, missed or not measured (``None``), and the figures."""

LIFECYCLE_TARGETS: tuple[Target, ...] = (
    (f"lazy start-up to first token <= {LAZY_STARTUP_LIMIT:.0%} of eager's", _lazy_startup),
    (f"first-use capture of a decode bucket <= {FIRST_USE_CAPTURE_LIMIT_MS:.0f} ms", _first_use_capture),
    (f"sleep frees >= {SLEEP_FREED_SHARE:.0%} of the graphs' and KV cache's bytes", _sleep_frees),
    ("wake and the first replay <= the first capture of every bucket", _wake_within_first_capture),
    (
        f"replay after an in-place weight update within {UPDATE_REPLAY_TOLERANCE:.0%} of before, none recaptured",
        _replay_after_update,
    ),
)
"""The ``lifecycle`` section's targets (``bench/bench_lifecycle.py`` prints these alone)."""

SLEEP_TARGETS: tuple[Target, ...] = (
    (
        f"sleep mode: every level frees >= {SLEEP_FREED_SHARE:.0%} of what it gives back, none recaptured",
        _kept_sleep_frees,
    ),
    (
        f"sleep mode level 0: wake and the first replay <= {KEPT_WAKE_OVER_FIRST_CAPTURE_LIMIT}x the first capture",
        _kept_wake,
    ),
    (
        f"sleep mode level 1: wake <= {LEVEL_1_WAKE_OVER_WEIGHT_COPY_LIMIT}x the weights' host-to-device copy",
        _level_1_wake,
    ),
    ("sleep mode level 2: wake, an in-place weight load and the first replay, none recaptured", _level_2_wake),
)
"""The targets of the ``lifecycle`` section's sleep-mode rows (``bench/bench_lifecycle.py`` prints these too)."""

TARGETS: tuple[Target, ...] = (
    (f"decode full <= {FULL_OVER_RAW_LIMIT}x raw replay at every batch size", _full_within_raw),
    ("breakable host cost per break below both peers'", _breaks_below_peers),
    ("batch-1 decode full <= torch.compile(mode='reduce-overhead')", _full_beats_reduce_overhead_at_batch_1),
    (f"{TP_PRESET} batch-1 full: TP=2 >= 1.5x and TP=4 >= 2.2x faster than TP=1", _tp_speedups),
    ("decode graph bytes per rank at a larger TP <= the smallest TP's of the model (default buckets)", _tp_graph_bytes),
    (f"{LARGE_TP_PRESET} batch-1 full: TP=8 >= {LARGE_TP_SPEEDUP}x faster than TP=4", _large_tp_speedup),
    (f"{TP_PRESET} start-up to first token at TP=4 <= {TP_STARTUP_LIMIT}x TP=1's", _tp_startup),
    *LIFECYCLE_TARGETS,
    *SLEEP_TARGETS,
)
"""Every stated target."""


def check_targets(result: BenchResult, targets: tuple[Target, ...] = TARGETS) -> list[TargetResult]:
    """Each of ``targets`` (every stated one by default), met, missed or not measured, with its figures."""
    return [TargetResult(name, *predicate(result)) for name, predicate in targets]
