"""The stdout table and the markdown summary: one block per section, one line per row, every row listed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .rows import BenchResult


@dataclass(frozen=True)
class Column:
    """A table column: its header and how one row renders in it."""

    header: str
    render: Callable[[Any], str]


def _ms(value: float) -> str:
    return f"{value:.3f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


DECODE_COLUMNS = (
    Column("preset", lambda r: r.preset),
    Column("backend", lambda r: r.backend),
    Column("bs", lambda r: str(r.batch_size)),
    Column("step ms", lambda r: _ms(r.step_ms)),
    Column("/raw", lambda r: _ratio(r.to_raw)),
    Column("/eager", lambda r: _ratio(r.to_eager)),
    Column("kernels", lambda r: "-" if r.kernels_per_step is None else f"{r.kernels_per_step:.0f}"),
    Column("host us", lambda r: f"{r.host_us:.0f}"),
    Column("floor ms", lambda r: _ms(r.floor_ms)),
    Column("of floor", lambda r: f"{r.floor_fraction:.0%}"),
)
BREAK_COLUMNS = (
    Column("implementation", lambda r: r.implementation),
    Column("workload", lambda r: r.workload),
    Column("breaks", lambda r: str(r.breaks)),
    Column("host us/break", lambda r: f"{r.host_us_per_break:.2f}"),
    Column("wall us/break", lambda r: f"{r.wall_us_per_break:.2f}"),
    Column("step ms", lambda r: _ms(r.step_ms)),
)
PREFILL_COLUMNS = (
    Column("preset", lambda r: r.preset),
    Column("backend", lambda r: r.backend),
    Column("shape", lambda r: f"{r.requests}x{r.tokens_per_request}"),
    Column("tokens", lambda r: str(r.tokens)),
    Column("step ms", lambda r: _ms(r.step_ms)),
    Column("speed-up", lambda r: _ratio(r.speedup)),
    Column("host us", lambda r: f"{r.host_us:.0f}"),
)
SPECULATIVE_COLUMNS = (
    Column("preset", lambda r: r.preset),
    Column("kind", lambda r: r.kind),
    Column("shape", lambda r: r.shape),
    Column("k", lambda r: "-" if r.drafts is None else str(r.drafts)),
    Column("tokens", lambda r: str(r.tokens)),
    Column("attention", lambda r: r.attention_backend),
    Column("eager ms", lambda r: _ms(r.eager_ms)),
    Column("graph ms", lambda r: _ms(r.graph_ms)),
    Column("eager/graph", lambda r: _ratio(r.speedup)),
    Column("eager host us", lambda r: f"{r.eager_host_us:.0f}"),
    Column("graph host us", lambda r: f"{r.graph_host_us:.0f}"),
)
DRAFT_COLUMNS = (
    Column("preset", lambda r: r.preset),
    Column("k", lambda r: str(r.drafts)),
    Column("requests", lambda r: str(r.requests)),
    Column("attention", lambda r: r.attention_backend),
    Column("eager ms", lambda r: _ms(r.eager_ms)),
    Column("graph ms", lambda r: _ms(r.graph_ms)),
    Column("eager/graph", lambda r: _ratio(r.speedup)),
    Column("graph host us", lambda r: f"{r.graph_host_us:.0f}"),
    Column("graphs", lambda r: str(r.graphs)),
    Column("draft capture s", lambda r: f"{r.draft_capture_s:.2f}"),
    Column("decode capture s", lambda r: f"{r.decode_capture_s:.2f}"),
    Column("draft/decode capture", lambda r: _ratio(r.capture_ratio)),
    Column("self-draft tok/step", lambda r: f"{r.self_draft_tokens_per_step:.2f}"),
)
CAPTURE_COLUMNS = (
    Column("preset", lambda r: r.preset),
    Column("phase", lambda r: r.phase),
    Column("backend", lambda r: r.backend),
    Column("graphs", lambda r: str(r.graphs)),
    Column("seconds", lambda r: f"{r.seconds:.2f}"),
    Column("repeat s", lambda r: "-" if r.repeat_seconds is None else f"{r.repeat_seconds:.2f}"),
    Column("GiB", lambda r: f"{r.bytes / 2**30:.3f}"),
    Column("repeat GiB", lambda r: "-" if r.repeat_bytes is None else f"{r.repeat_bytes / 2**30:.3f}"),
    Column("estimate GiB", lambda r: "-" if r.estimate_bytes is None else f"{r.estimate_bytes / 2**30:.3f}"),
    Column("est. error", lambda r: "-" if r.estimate_error is None else f"{r.estimate_error:+.1%}"),
    Column("estimate s", lambda r: "-" if r.estimate_seconds is None else f"{r.estimate_seconds:.2f}"),
)
COMPILE_COLUMNS = (
    Column("preset", lambda r: r.preset),
    Column("compiler", lambda r: r.compiler),
    Column("cold compile s", lambda r: f"{r.cold_seconds:.1f}"),
    Column("warm compile s", lambda r: f"{r.warm_seconds:.1f}"),
    Column("cold capture s", lambda r: f"{r.cold_capture_seconds:.1f}"),
    Column("warm capture s", lambda r: f"{r.warm_capture_seconds:.1f}"),
)
MIGRATION_COLUMNS = (
    Column("tree", lambda r: r.tree),
    Column("files", lambda r: str(r.files)),
    Column("-j", lambda r: str(r.jobs)),
    Column("seconds", lambda r: f"{r.seconds:.2f}"),
    Column("files/s", lambda r: f"{r.files_per_second:.0f}"),
    Column("exit", lambda r: str(r.exit_status)),
    Column("recheck", lambda r: str(r.recheck_exit_status)),
)


def _gib_per_rank(values: Sequence[int] | None) -> str:
    return "-" if values is None else "/".join(f"{value / 2**30:.3f}" for value in values)


TP_COLUMNS = (
    Column("preset", lambda r: r.preset),
    Column("TP", lambda r: str(r.tp_size)),
    Column("backend", lambda r: r.backend),
    Column("bs", lambda r: str(r.batch_size)),
    Column(
        "all-reduce", lambda r: r.all_reduce if r.all_reduce_choice in ("auto", "none") else f"{r.all_reduce} (forced)"
    ),
    Column("step ms", lambda r: _ms(r.step_ms)),
    Column("vs TP=1", lambda r: _ratio(r.speedup_over_tp1)),
    Column("/raw", lambda r: _ratio(r.to_raw)),
    Column("host us", lambda r: f"{r.host_us:.0f}"),
    Column("all-reduce share", lambda r: "-" if r.all_reduce_share is None else f"{r.all_reduce_share:.0%}"),
    Column("graph GiB per rank", lambda r: _gib_per_rank(r.graph_bytes_per_rank)),
    Column("capture s", lambda r: "-" if r.capture_seconds is None else f"{r.capture_seconds:.2f}"),
)
TP_START_COLUMNS = (
    Column("preset", lambda r: r.preset),
    Column("TP", lambda r: str(r.tp_size)),
    Column("all-reduce", lambda r: r.all_reduce),
    Column("to first token s", lambda r: f"{r.startup_seconds:.1f}"),
    Column("weights ready s", lambda r: f"{r.weights_seconds:.1f}"),
    Column("capture s", lambda r: f"{r.capture_seconds:.2f}"),
    Column("decode graphs", lambda r: str(r.decode_graphs)),
    Column("decode GiB per rank", lambda r: _gib_per_rank(r.decode_graph_bytes_per_rank)),
    Column("prefill graphs", lambda r: str(r.prefill_graphs)),
    Column("prefill GiB per rank", lambda r: _gib_per_rank(r.prefill_graph_bytes_per_rank)),
    Column("collective buffers GiB per rank", lambda r: _gib_per_rank(r.collective_buffer_bytes_per_rank)),
    Column("head gather buffer GiB per rank", lambda r: _gib_per_rank(r.head_gather_bytes_per_rank)),
)
LIFECYCLE_COLUMNS = (
    Column("preset", lambda r: r.preset),
    Column("backend", lambda r: r.backend),
    Column("buckets", lambda r: str(r.buckets)),
    Column("start-up eager s", lambda r: f"{r.startup_s['eager']:.2f}" if "eager" in r.startup_s else "-"),
    Column("lazy s", lambda r: f"{r.startup_s['lazy']:.2f}" if "lazy" in r.startup_s else "-"),
    Column("lazy/eager", lambda r: _ratio(r.lazy_over_eager)),
    Column("first-use capture ms", lambda r: f"{r.first_use_capture_ms:.1f}"),
    Column("first capture s", lambda r: f"{r.first_capture_s:.2f}"),
    Column("wake+replay s", lambda r: f"{r.wake_and_first_replay_s:.2f}"),
    Column("/first capture", lambda r: _ratio(r.wake_over_first_capture)),
    Column("sleep freed GiB", lambda r: f"{r.sleep_freed_bytes / 2**30:.3f}"),
    Column("graphs+KV GiB", lambda r: f"{r.graph_and_kv_bytes / 2**30:.3f}"),
    Column("freed share", lambda r: "-" if r.freed_share is None else f"{r.freed_share:.1%}"),
    Column("replay us", lambda r: f"{r.replay_us_before:.1f}"),
    Column("after update us", lambda r: f"{r.replay_us_after_update:.1f}"),
    Column("after/before", lambda r: _ratio(r.after_over_before)),
    Column("recaptured", lambda r: ",".join(map(str, r.recaptured)) or "none"),
)
SLEEP_COLUMNS = (
    Column("preset", lambda r: r.preset),
    Column("backend", lambda r: r.backend),
    Column("level", lambda r: str(r.level)),
    Column("buckets", lambda r: str(r.buckets)),
    Column("sleep s", lambda r: f"{r.sleep_s:.3f}"),
    Column("wake s", lambda r: f"{r.wake_s:.3f}"),
    Column("wake+replay s", lambda r: f"{r.wake_and_first_replay_s:.3f}"),
    Column("first capture s", lambda r: f"{r.first_capture_s:.2f}"),
    Column("/first capture", lambda r: _ratio(r.wake_over_first_capture)),
    Column("freed GiB", lambda r: f"{r.freed_bytes / 2**30:.3f}"),
    Column("given GiB", lambda r: f"{r.given_bytes / 2**30:.3f}"),
    Column("freed share", lambda r: "-" if r.freed_share is None else f"{r.freed_share:.1%}"),
    Column("wake/weight copy", lambda r: _ratio(r.wake_over_weight_copy) if r.level == 1 else "-"),
    Column("captured again", lambda r: str(r.captured_again)),
)
SKIPPED_COLUMNS = (
    Column("section", lambda r: r.section),
    Column("what", lambda r: r.what),
    Column("reason", lambda r: r.reason),
)
WRONG_COLUMNS = (
    Column("section", lambda r: r.section),
    Column("what", lambda r: r.what),
    Column("detail", lambda r: r.detail),
)

SECTIONS: tuple[tuple[str, str, tuple[Column, ...]], ...] = (
    ("decode", "Decode step", DECODE_COLUMNS),
    ("breaks", "Breaks alone", BREAK_COLUMNS),
    ("prefill", "Prefill step", PREFILL_COLUMNS),
    ("speculative", "Speculative verify and mixed steps, eager vs graphed", SPECULATIVE_COLUMNS),
    ("draft", "EAGLE draft rounds (extend + k - 1 chained steps), eager vs graphed", DRAFT_COLUMNS),
    ("capture", "Capture of the default buckets", CAPTURE_COLUMNS),
    ("compile", "tc_piecewise compile, fresh process", COMPILE_COLUMNS),
    ("migration", "cudagraph-migrate", MIGRATION_COLUMNS),
    ("tp", "Tensor-parallel decode step (rank 0's time; graph memory of the measured batch sizes)", TP_COLUMNS),
    ("tp_start", "Tensor-parallel start-up with the default graphs", TP_START_COLUMNS),
    ("lifecycle", "Decode graphs across an engine's life", LIFECYCLE_COLUMNS),
    ("sleep", "Sleep mode: graphs kept across a sleep, per level", SLEEP_COLUMNS),
    ("wrong", "WRONG ANSWERS (not results; the run fails)", WRONG_COLUMNS),
    ("skipped", "Not measured", SKIPPED_COLUMNS),
)
"""(result attribute, title, columns) in print order."""


def format_rows(rows: Sequence[Any], columns: Sequence[Column], *, markdown: bool = False) -> str:
    """``rows`` as an aligned plain-text table (or a markdown table), one line per row, headers first."""
    cells = [[column.header for column in columns]] + [[column.render(row) for column in columns] for row in rows]
    if markdown:
        lines = ["| " + " | ".join(line) + " |" for line in cells]
        lines.insert(1, "|" + "---|" * len(columns))
        return "\n".join(lines)
    widths = [max(len(line[index]) for line in cells) for index in range(len(columns))]
    padded = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)) for line in cells]
    return "\n".join(line.rstrip() for line in padded)


def describe_environment(result: BenchResult) -> str:
    """One line: device, driver, torch, CUDA, flashinfer."""
    env = result.environment
    keys = ("device", "driver", "torch", "cuda", "flashinfer", "date")
    return ", ".join(f"{key} {env[key]}" for key in keys if env.get(key) is not None)


def format_report(result: BenchResult, *, markdown: bool = False) -> str:
    """Every non-empty section of ``result`` as a titled table."""
    blocks = [describe_environment(result)]
    for attribute, title, columns in SECTIONS:
        rows = getattr(result, attribute)
        if rows:
            heading = f"## {title}" if markdown else f"== {title}"
            blocks.append(f"{heading}\n\n{format_rows(rows, columns, markdown=markdown)}")
    return "\n\n".join(blocks) + "\n"
