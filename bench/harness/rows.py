"""The results: one frozen dataclass per row kind, and ``BenchResult``, which holds them all and round-trips JSON.

Never imports torch: the compare, report and target logic read results on any machine.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

SCHEMA_VERSION = 1
"""Bumped when a row changes meaning; ``BenchResult.from_json`` refuses other versions. A new row kind is no bump:
a result written before it reads back with that list empty."""


@dataclass(frozen=True)
class DecodeRow:
    """One decode configuration at one batch size (medians over rotating inputs)."""

    preset: str
    backend: str
    batch_size: int
    step_ms: float
    """Median step time between CUDA events recorded around each step, launched back to back."""
    host_us: float
    """Median time the step call takes to return when launched onto an idle device."""
    kernels_per_step: float | None
    """Device activities (kernels, copies, memsets) per step as torch.profiler records them; None if unavailable."""
    floor_ms: float
    """Weight bytes / measured device copy bandwidth: no decode step can be faster."""
    to_raw: float | None = None
    """``step_ms`` over the raw ``CUDAGraph.replay`` of the same forward at the same batch size."""
    to_eager: float | None = None
    """``step_ms`` over the eager forward at the same batch size."""
    kernel_set: str | None = None
    """The layer kernel set the row ran (``torch``, ``triton``, ``flashinfer``): a compiled forward may get another
    set than the engine's (``ModelRunner.kernels_for``); ``None`` in results written before it was recorded."""

    @property
    def floor_fraction(self) -> float:
        """How much of the weight-bandwidth floor this step reaches (1.0 = at the floor)."""
        return self.floor_ms / self.step_ms


@dataclass(frozen=True)
class BreakRow:
    """Per-break cost of one breakable implementation, against one full graph of the same work."""

    implementation: str
    workload: str
    """``empty``: tiny kernels split by breaks that call a function doing nothing; ``model``: the 16-layer model's
    decode step at batch 1, broken at its attention op."""
    breaks: int
    host_us_per_break: float
    wall_us_per_break: float
    step_ms: float


@dataclass(frozen=True)
class PrefillRow:
    """One prefill configuration on one batch shape."""

    preset: str
    backend: str
    requests: int
    tokens_per_request: int
    step_ms: float
    host_us: float
    speedup: float | None = None
    """Eager step time over this one on the same shape."""

    @property
    def tokens(self) -> int:
        """Tokens in the step."""
        return self.requests * self.tokens_per_request


@dataclass(frozen=True)
class DraftRow:
    """One EAGLE draft round shape (``harness.drafting``): eager against graphed, capture beside the target's decode
    capture, and the self-draft head's tokens a step."""

    preset: str
    attention_backend: str
    requests: int
    drafts: int
    """``k``: the round's draft extend has ``k + 1`` rows a request, its chain ``k - 1`` steps."""
    eager_ms: float
    """Median time of the round run eagerly (draft extend, then the chain)."""
    graph_ms: float
    """Median time of the round's two replays."""
    eager_host_us: float
    graph_host_us: float
    graphs: int
    """Buckets captured, by the draft runners and by the target's decode runner alike."""
    draft_capture_s: float
    """Seconds to capture both draft runners (chain and extend) at every bucket."""
    decode_capture_s: float
    """Seconds to capture the target's decode runner at the same buckets."""
    self_draft_tokens_per_step: float
    """Tokens a request gains a verify step with the self-draft head over a one-layer target (``k + 1`` at best)."""

    @property
    def speedup(self) -> float:
        """Eager round time over graphed round time (the issue's target: at least 5 at ``k = 3``, batch 1)."""
        return self.eager_ms / self.graph_ms

    @property
    def capture_ratio(self) -> float:
        """Draft capture seconds over the target's decode capture seconds (the target: at most 1)."""
        return self.draft_capture_s / self.decode_capture_s


@dataclass(frozen=True)
class SpeculativeRow:
    """One speculative step shape, eager against graphed in the same run.

    ``verify``: ``requests`` requests, each its last token and ``drafts`` drafts over cached context, logits of every
    token, replayed by the verify runner (``ModelRunner.init_verify_cuda_graph(drafts + 1)``, decode ``full``).
    ``mixed``: one extend step of ``requests - 1`` running requests' next tokens beside one prompt chunk, replayed by
    the prefill runner (``breakable``).
    """

    kind: str
    """``verify`` or ``mixed``."""
    preset: str
    attention_backend: str
    """The engine's attention backend the step ran on (``triton`` where the one asked for runs no verify steps)."""
    requests: int
    tokens: int
    """Tokens in the step: ``requests * (drafts + 1)`` for a verify step, running requests plus the chunk mixed."""
    drafts: int | None
    """Draft tokens per request (``k``) of a verify step; None for a mixed step."""
    eager_ms: float
    """Median step time of the eager forward (CUDA events, back to back)."""
    graph_ms: float
    """Median step time of the runner's replay."""
    eager_host_us: float
    """Median time the eager step call takes to return on an idle device."""
    graph_host_us: float
    """Median time the replay call takes to return on an idle device."""

    @property
    def speedup(self) -> float:
        """Eager step time over graphed step time."""
        return self.eager_ms / self.graph_ms

    @property
    def shape(self) -> str:
        """``BxQ`` of a verify step (requests x tokens each, ``Q = drafts + 1``), ``R+C`` of a mixed one (running
        requests' next tokens + the prompt chunk's tokens)."""
        if self.drafts is not None:
            return f"{self.requests}x{self.drafts + 1}"
        running = self.requests - 1
        return f"{running}+{self.tokens - running}"


@dataclass(frozen=True)
class CaptureRow:
    """What capturing a phase's default buckets cost with one backend: a first capture, then (after ``shutdown``
    and ``estimate_capture_memory()``) a repeat, whose bytes the estimate predicted."""

    preset: str
    phase: str
    backend: str
    graphs: int
    seconds: float
    """Wall time of the first capture (compiling the model forward included, for a backend that compiles)."""
    bytes: int
    """Device memory the first capture kept."""
    repeat_seconds: float | None = None
    """Wall time of the repeat capture (compiled code and loaded kernels reused)."""
    repeat_bytes: int | None = None
    """Device memory the repeat capture kept: what ``estimate_bytes`` predicted."""
    estimate_bytes: int | None = None
    """``estimate_capture_memory()``'s total, made before the repeat capture."""
    estimate_seconds: float | None = None
    """Wall time of making the estimate (its probe captures)."""

    @property
    def estimate_error(self) -> float | None:
        """(estimate - measured) / measured for the repeat capture; None without both."""
        if self.estimate_bytes is None or not self.repeat_bytes:
            return None
        return (self.estimate_bytes - self.repeat_bytes) / self.repeat_bytes


@dataclass(frozen=True)
class CompileRow:
    """``tc_piecewise`` compile seconds in a fresh process: with empty compile caches (cold) and again (warm)."""

    preset: str
    compiler: str
    cold_seconds: float
    warm_seconds: float
    cold_capture_seconds: float
    warm_capture_seconds: float


@dataclass(frozen=True)
class MigrationRow:
    """``cudagraph-migrate`` over a tree with ``-j jobs``."""

    tree: str
    files: int
    jobs: int
    seconds: float
    exit_status: int
    recheck_exit_status: int

    @property
    def files_per_second(self) -> float:
        """Throughput of the run."""
        return self.files / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class TensorParallelRow:
    """One decode configuration at one tensor-parallel size and batch size, timed on rank 0 (every rank steps in
    lock-step: each all-reduce waits for all of them)."""

    preset: str
    tp_size: int
    backend: str
    """``eager``, ``raw`` (one ``CUDAGraph`` of the forward on the batch's own tensors), ``full``, ``breakable``,
    ``tc_piecewise``."""
    batch_size: int
    all_reduce_choice: str
    """What the ranks were asked to use: ``auto`` or a forced path (``process-group``, ``symm-mem``); ``none`` at
    TP=1."""
    all_reduce: str
    """The path this step's all-reduces took: ``symm-mem`` (one-shot, messages that fit its buffer),
    ``process-group`` (NCCL), or ``none`` at TP=1."""
    step_ms: float
    """Mean step time over back-to-back steps on rank 0."""
    host_us: float
    """Median host time of the step call on rank 0, launched onto an idle device."""
    graph_bytes_per_rank: list[int] | None = None
    """Device memory this backend's graphs of every measured batch size took on each rank (rank order); None for
    eager and raw."""
    capture_seconds: float | None = None
    """Wall time of capturing those graphs on rank 0."""
    all_reduce_share: float | None = None
    """All-reduce kernels' device time over all kernels' device time in a step (torch.profiler on rank 0; waiting
    for a slower rank counts as all-reduce time)."""
    speedup_over_tp1: float | None = None
    """The TP=1 step of the same backend and batch size over this step."""
    to_raw: float | None = None
    """``step_ms`` over the raw replay at the same size, batch and all-reduce choice."""


@dataclass(frozen=True)
class TensorParallelStartRow:
    """Start-up of one tensor-parallel size with the default graphs (decode ``full``, prefill ``breakable``, the
    default buckets): from launching the ranks to rank 0's first token, and each rank's graph memory."""

    preset: str
    tp_size: int
    all_reduce: str
    """The path ``auto`` chose (``symm-mem`` or ``process-group``; ``none`` at TP=1)."""
    startup_seconds: float
    """From launching the rank processes to rank 0's first generated token (process start, weights, capture,
    one prefill step)."""
    weights_seconds: float
    """From the launch to rank 0's weights being ready (process start and random weights)."""
    capture_seconds: float
    """Rank 0's capture of both phases' graphs."""
    decode_graphs: int
    decode_graph_bytes_per_rank: list[int]
    prefill_graphs: int
    prefill_graph_bytes_per_rank: list[int]
    collective_buffer_bytes_per_rank: list[int] | None = None
    """Device memory the group's collectives took when warmed up before capture (NCCL's buffers, set up once per
    group; ``cudagraph.engine.distributed.TensorParallelGroup.warm_collectives``); zeros at TP=1."""
    head_gather_bytes_per_rank: list[int] | None = None
    """The vocabulary-parallel head's gather buffer (``CausalLM.logits_gather``): outside the graphs, one for every
    bucket of every phase; zeros at TP=1."""

    @property
    def largest_decode_graph_bytes(self) -> int:
        """The most any rank's decode graphs took."""
        return max(self.decode_graph_bytes_per_rank, default=0)


def _over(numerator: float, denominator: float) -> float | None:
    """``numerator / denominator``, or None when the denominator was not measured (zero or less)."""
    return numerator / denominator if denominator > 0 else None


@dataclass(frozen=True)
class LifecycleRow:
    """Decode graphs across one engine's life, one preset and graph backend (random bf16 weights, the default
    bucket schedule up to the section's largest batch): start-up, a first-use capture, sleep, wake, and a replay
    after an in-place weight update."""

    preset: str
    backend: str
    """The decode graph backend (``full``, ``breakable``, ``tc_piecewise``)."""
    buckets: int
    """Decode buckets a capture of all of them captures."""
    startup_s: dict[str, float]
    """Capture policy (``eager``, ``lazy``) -> seconds from the engine built (weights loaded, not timed) to the first
    decode token of one request, graphs included."""
    first_use_capture_ms: float
    """Under ``lazy``, the capture of decode bucket 8 by its first step, after the engine's first step."""
    first_capture_s: float
    """Capture of every bucket under ``eager`` (``CaptureStats.seconds``)."""
    graph_and_kv_bytes: int
    """Device memory the graphs took (free before capture minus free after the replays) plus the KV cache's bytes."""
    sleep_freed_bytes: int
    """Free device memory ``sleep()`` won (``MemoryLevels.freed_by_sleep``)."""
    wake_s: float
    """``wake()``: the KV cache allocated again and every bucket captured again."""
    wake_and_first_replay_s: float
    """``wake()`` and the first replayed decode step of batch 8."""
    replay_us_before: float
    """One replayed decode step of batch 8, mean over back-to-back steps, before the weight update."""
    replay_us_after_update: float
    """The same after an in-place update of every weight."""
    recaptured: list[int] = field(default_factory=list)
    """Decode buckets the in-place update captured again (nothing, when graphs stay valid as they must)."""

    @property
    def lazy_over_eager(self) -> float | None:
        """Start-up to first token under ``lazy`` over under ``eager``."""
        return _over(self.startup_s.get("lazy", 0.0), self.startup_s.get("eager", 0.0))

    @property
    def freed_share(self) -> float | None:
        """Bytes sleep freed over the graphs' and KV cache's bytes (None when that reading is not positive)."""
        return _over(self.sleep_freed_bytes, self.graph_and_kv_bytes)

    @property
    def wake_over_first_capture(self) -> float | None:
        """Wake and the first replayed step over the first capture of every bucket."""
        return _over(self.wake_and_first_replay_s, self.first_capture_s)

    @property
    def after_over_before(self) -> float | None:
        """Replay after the in-place update over replay before it."""
        return _over(self.replay_us_after_update, self.replay_us_before)


@dataclass
class SleepRow:
    """One sleep and wake of an engine built with sleep mode (weights, KV cache and graph pool in sleepable memory),
    at one level (0: weights stay; 1: copied to host and back; 2: discarded, then loaded in place after the wake)."""

    preset: str
    backend: str
    level: int
    buckets: int
    first_capture_s: float
    """Capture of every bucket (``CaptureStats.seconds``), the figure a wake that recaptures would pay again."""
    given_bytes: int
    """What this level gives back: the graphs' (free before capture minus after) and KV cache's bytes, plus the
    weights' at levels 1 and 2."""
    freed_bytes: int
    """Free device memory ``sleep`` won (``MemoryLevels.freed_by_sleep``)."""
    weight_bytes: int
    h2d_bytes_per_s: float
    """Host-to-device copy rate from pinned memory, measured in the same run."""
    sleep_s: float
    wake_s: float
    """``wake()``: pages mapped back, the KV cache zeroed, level 1's weights copied back."""
    wake_and_first_replay_s: float
    """``wake()``, level 2's in-place load of the weights, and the first replayed decode step."""
    captured_again: int
    """Buckets whose graph is not the one captured before the sleep (0 when the graphs outlive it)."""

    @property
    def freed_share(self) -> float | None:
        """Bytes the sleep freed over what the level gives back."""
        return _over(self.freed_bytes, self.given_bytes)

    @property
    def wake_over_first_capture(self) -> float | None:
        """Wake and the first replayed step over the first capture of every bucket."""
        return _over(self.wake_and_first_replay_s, self.first_capture_s)

    @property
    def wake_over_weight_copy(self) -> float | None:
        """``wake()`` over the time the weights' bytes take to copy host to device at the measured rate."""
        if self.weight_bytes <= 0 or self.h2d_bytes_per_s <= 0:
            return None
        return self.wake_s / (self.weight_bytes / self.h2d_bytes_per_s)


@dataclass(frozen=True)
class SkippedRow:
    """A configuration that was not measured, and why (no CUDA, a peer not installed, a config that rejects it)."""

    section: str
    what: str
    reason: str


@dataclass(frozen=True)
class WrongAnswer:
    """A configuration whose greedy tokens differ from eager's: not a result, and the run fails."""

    section: str
    what: str
    detail: str


def with_ratios(rows: list[DecodeRow]) -> list[DecodeRow]:
    """``rows`` with ``to_raw`` and ``to_eager`` filled from the raw and eager rows of the same preset and batch."""
    reference = {(row.preset, row.backend, row.batch_size): row.step_ms for row in rows}

    def ratio(row: DecodeRow, backend: str) -> float | None:
        base = reference.get((row.preset, backend, row.batch_size))
        return row.step_ms / base if base else None

    return [dataclasses.replace(row, to_raw=ratio(row, "raw"), to_eager=ratio(row, "eager")) for row in rows]


def with_tensor_parallel_ratios(rows: list[TensorParallelRow]) -> list[TensorParallelRow]:
    """``rows`` with ``speedup_over_tp1`` (the TP=1 row of the same preset, backend and batch size over this one)
    and ``to_raw`` (this one over the raw row of the same preset, size, batch and all-reduce choice)."""
    tp1 = {(row.preset, row.backend, row.batch_size): row.step_ms for row in rows if row.tp_size == 1}
    raw = {
        (row.preset, row.tp_size, row.batch_size, row.all_reduce_choice): row.step_ms
        for row in rows
        if row.backend == "raw"
    }

    def over_raw(row: TensorParallelRow) -> float | None:
        base = raw.get((row.preset, row.tp_size, row.batch_size, row.all_reduce_choice))
        return row.step_ms / base if base else None

    def speedup(row: TensorParallelRow) -> float | None:
        single = tp1.get((row.preset, row.backend, row.batch_size))
        return single / row.step_ms if single else None

    return [dataclasses.replace(row, speedup_over_tp1=speedup(row), to_raw=over_raw(row)) for row in rows]


def with_speedups(rows: list[PrefillRow]) -> list[PrefillRow]:
    """``rows`` with ``speedup`` = eager step / this step on the same preset and shape."""
    eager = {(row.preset, row.requests, row.tokens_per_request): row.step_ms for row in rows if row.backend == "eager"}

    def speedup(row: PrefillRow) -> float | None:
        base = eager.get((row.preset, row.requests, row.tokens_per_request))
        return base / row.step_ms if base else None

    return [dataclasses.replace(row, speedup=speedup(row)) for row in rows]


ROW_TYPES: dict[str, type[Any]] = {
    "decode": DecodeRow,
    "breaks": BreakRow,
    "prefill": PrefillRow,
    "speculative": SpeculativeRow,
    "draft": DraftRow,
    "capture": CaptureRow,
    "compile": CompileRow,
    "migration": MigrationRow,
    "tp": TensorParallelRow,
    "tp_start": TensorParallelStartRow,
    "lifecycle": LifecycleRow,
    "sleep": SleepRow,
    "skipped": SkippedRow,
    "wrong": WrongAnswer,
}
"""JSON key -> row type; ``BenchResult`` has one list per key."""


@dataclass
class BenchResult:
    """Everything one run measured, with the machine it ran on and the settings it ran with."""

    environment: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    decode: list[DecodeRow] = field(default_factory=list)
    breaks: list[BreakRow] = field(default_factory=list)
    prefill: list[PrefillRow] = field(default_factory=list)
    speculative: list[SpeculativeRow] = field(default_factory=list)
    draft: list[DraftRow] = field(default_factory=list)
    capture: list[CaptureRow] = field(default_factory=list)
    compile: list[CompileRow] = field(default_factory=list)
    migration: list[MigrationRow] = field(default_factory=list)
    tp: list[TensorParallelRow] = field(default_factory=list)
    tp_start: list[TensorParallelStartRow] = field(default_factory=list)
    lifecycle: list[LifecycleRow] = field(default_factory=list)
    sleep: list[SleepRow] = field(default_factory=list)
    skipped: list[SkippedRow] = field(default_factory=list)
    wrong: list[WrongAnswer] = field(default_factory=list)

    schema_version: ClassVar[int] = SCHEMA_VERSION

    def skip(self, section: str, what: str, reason: str) -> None:
        """Record that ``what`` in ``section`` was not measured, and why."""
        self.skipped.append(SkippedRow(section, what, reason))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the schema version, environment, settings and one list of row dicts per kind."""
        rows = {key: [asdict(row) for row in getattr(self, key)] for key in ROW_TYPES}
        return {"schema_version": SCHEMA_VERSION, "environment": self.environment, "settings": self.settings, **rows}

    def to_json(self) -> str:
        """Indented JSON text."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchResult:
        """Read back what ``to_dict`` wrote; another schema version or an unknown row field is an error."""
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"bench result schema_version {version!r} is not supported; this harness reads {SCHEMA_VERSION}"
            )
        result = cls(environment=dict(data.get("environment", {})), settings=dict(data.get("settings", {})))
        for key, row_type in ROW_TYPES.items():
            names = {f.name for f in dataclasses.fields(row_type)}
            for index, row in enumerate(data.get(key, [])):
                unknown = sorted(set(row) - names)
                if unknown:
                    raise ValueError(f"{key}[{index}] has unknown fields {unknown}; {row_type.__name__} has {names}")
                getattr(result, key).append(row_type(**row))
        return result

    @classmethod
    def load(cls, path: Path) -> BenchResult:
        """Read a result file."""
        return cls.from_dict(json.loads(path.read_text()))
