"""``merge RUN.json... --out MERGED.json``: one result from runs of the same machine split over several calls (a
time-limited device runs ``--sections`` or ``--batch-sizes`` a piece at a time).

Each row keeps the ratios it was measured with (a decode row's ``to_raw`` is against the raw replay of its own run),
so merging never mixes two runs inside one ratio. A row measured in several runs (same preset, configuration and
shape) is taken from the last run given. Runs of different machines or library versions are refused: their figures
do not belong in one table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .rows import ROW_TYPES, BenchResult

MACHINE_KEYS = ("device", "driver", "torch", "cuda", "flashinfer", "breakable_cuda_graphs", "piecewise_cuda_graphs")
"""Environment fields that must agree between merged runs."""

ROW_KEYS: dict[str, Callable[[Any], tuple[object, ...]]] = {
    "decode": lambda row: (row.preset, row.backend, row.batch_size),
    "breaks": lambda row: (row.implementation, row.workload),
    "prefill": lambda row: (row.preset, row.backend, row.requests, row.tokens_per_request),
    "speculative": lambda row: (row.preset, row.kind, row.requests, row.tokens, row.drafts),
    "draft": lambda row: (row.preset, row.requests, row.drafts),
    "capture": lambda row: (row.preset, row.phase, row.backend),
    "compile": lambda row: (row.preset, row.compiler),
    "migration": lambda row: (row.tree, row.jobs),
    "tp": lambda row: (row.preset, row.tp_size, row.backend, row.batch_size, row.all_reduce_choice),
    "tp_start": lambda row: (row.preset, row.tp_size),
    "lifecycle": lambda row: (row.preset, row.backend),
    "sleep": lambda row: (row.preset, row.backend, row.level),
    "skipped": lambda row: (row.section, row.what),
    "wrong": lambda row: (row.section, row.what, row.detail),
}
"""Section -> what identifies one of its rows (a later run's row with the same key replaces an earlier one)."""


class MergeError(ValueError):
    """The runs cannot be merged (different machines or versions, nothing given)."""


def merge_results(runs: Sequence[tuple[str, BenchResult]]) -> BenchResult:
    """One result holding every row of ``runs`` (``(name, result)`` pairs, oldest first)."""
    if not runs:
        raise MergeError("merge needs at least one result file")
    first_name, first = runs[0]
    for name, run in runs[1:]:
        differing = [key for key in MACHINE_KEYS if run.environment.get(key) != first.environment.get(key)]
        if differing:
            shown = ", ".join(
                f"{key} {first.environment.get(key)!r} vs {run.environment.get(key)!r}" for key in differing
            )
            raise MergeError(f"{name} was not measured on the machine of {first_name}: {shown}")
    merged = BenchResult(
        environment=dict(runs[-1][1].environment),
        settings={"merged_from": [{"file": name, "settings": run.settings} for name, run in runs]},
    )
    for section in ROW_TYPES:
        key_of = ROW_KEYS[section]
        rows: dict[tuple[object, ...], Any] = {}
        for _, run in runs:
            for row in getattr(run, section):
                rows.pop(key_of(row), None)  # a re-measured row moves to where its newest run puts it
                rows[key_of(row)] = row
        getattr(merged, section).extend(rows.values())
    return merged


def merge_files(paths: Sequence[Path]) -> BenchResult:
    """``merge_results`` of result files, by file name."""
    return merge_results([(path.name, BenchResult.load(path)) for path in paths])
