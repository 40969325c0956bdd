"""The part every runner shares: buckets, the capture loop, capture stats and teardown.

The loop captures largest bucket first into the backend's one shared pool with the garbage collector frozen, so the
smaller graphs reuse the memory the largest one reserved. Subclasses own their static buffers and say how one bucket
is fed (``_prepare_capture``) and replayed (``replay``). Everything device-specific (capturing, replaying, reading
memory) is the backend's: this module runs the same code whatever backend it is given.

Replay is the hot path: whatever a step needs that does not depend on the step (the static batch, the forward
context's ``with`` block, the backend's bound replay, the output sliced to each batch size) is made once per bucket
at capture and kept in its ``StaticBucket``, so a step only copies inputs, refreshes attention metadata and replays.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import gc
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from tqdm import tqdm

from cudagraph.backend import BaseCudaGraphBackend, EntryInputs, ModelTraceError, make_backend, warmups_needed
from cudagraph.backend_utils import (
    CaptureOptions,
    ForwardContext,
    ForwardContextScope,
    MemoryReading,
    ShapeDescriptor,
    freeze_gc,
)
from cudagraph.config import CapturePolicy, CudaGraphConfig, MemoryBudget, Phase, PhaseConfig

from . import lifecycle
from .agreement import agreed_plan, agreement_of
from .capture_loop import CaptureLoop, out_of_memory_guarded
from .forward_batch import ForwardBatch
from .graph_inputs import GraphInputGuard, graph_read_tensors, moved_error
from .lazy_capture import LazyCapture
from .lifecycle import RunnerAsleepError, RunnerState
from .memory_plan import (
    CaptureMemoryEstimate,
    ProbeCapture,
    estimate_from_probes,
    plan_capture,
    probe_shapes,
    skipped_summary,
)
from .metrics import ReplayMetrics
from .protocols import ModelRunnerLike, traceable_forward
from .replay_metadata import ReplayHook, bind_replay_hook
from .routing import EagerReason, Route, RouteTable, check_padding_ratio, padded_bucket
from .static_buffers import StaticInputs
from .stats import CaptureStats, ShapeCaptureStats

logger = logging.getLogger(__name__)


_NO_CONTEXT = contextlib.nullcontext()
"""The ``with`` block of a bucket whose replay reads no forward context (stateless, so one serves every bucket)."""


RENAMED_METHODS: dict[str, str] = {
    "capture_one_shape": "capture_bucket",
    "replay_graph": "replay_bucket",
    "replay_routed": "replay",
}
"""Runner methods renamed after cudagraph-runner 0.1.0 (old name: new name); the old names stay until 1.0.0."""


def _warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(
        f"{old}() is deprecated since cudagraph-runner 0.2.0 and will be removed in 1.0.0; use {new}() "
        f"(`nox -s migrate` rewrites calls and overrides)",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def _beneath(runner: object, new: str) -> Callable[..., Any]:
    """The implementation of ``new`` that a deprecated alias forwards to: the one beneath an override that serves
    under both names (so that the override's ``super().old(...)`` reaches the real method, not itself)."""
    return getattr(type(runner), f"_{new}_beneath", None) or getattr(type(runner), new)


def _serve_under_new_name(cls: type, old: str, new: str) -> None:
    """Let ``cls``'s override of ``old`` answer calls of ``new`` too (``replay``'s ``route`` made optional)."""
    warnings.warn(
        f"{cls.__qualname__} overrides {old}(), renamed {new}() after cudagraph-runner 0.1.0; the override now "
        f"serves as {new}() (rename it: `nox -s migrate` does)",
        DeprecationWarning,
        stacklevel=4,
    )
    override = vars(cls)[old]
    setattr(cls, f"_{new}_beneath", getattr(super(cls, cls), new))
    if new == "replay":

        def replay(self: Any, batch: ForwardBatch, route: Route | None = None) -> torch.Tensor:
            if route is None:
                route = batch.route if batch.route is not None else self.route(batch)
            return override(self, batch, route)  # type: ignore[no-any-return]

        setattr(cls, new, replay)
    else:
        setattr(cls, new, override)


def _profiler_activities() -> list[torch.profiler.ProfilerActivity]:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities


@dataclass
class StaticBucket:
    """What one bucket replays with, made once: the batch viewing the static buffers that its graph was captured
    with, the forward context its eager breaks read at replay and the ``with`` block that sets it, and (after
    capture) the backend's bound replay and its output sliced to every row count that replays this bucket."""

    batch: ForwardBatch
    forward_context: ForwardContext
    context_scope: contextlib.AbstractContextManager[Any] = _NO_CONTEXT
    """Sets ``forward_context`` around a replay (a no-op block when the backend computes attention metadata inside
    the graph, so nothing reads the context at replay)."""
    replay: Callable[[], Any] | None = None
    """The backend's ``replay_fn`` for this bucket: replays and returns the output."""
    output: Any = None
    """The static output the capture returned (what ``replay`` returns, for backends whose output is static)."""
    output_rows: dict[int, torch.Tensor] = field(default_factory=dict)
    """``output[:rows]`` for every row count a replay of this bucket returns."""

    def bind_replay(self, replay: Callable[[], Any], output: Any, row_counts: Iterable[int]) -> None:
        """Keep the bound replay and its output, with the output's first ``rows`` rows for each of ``row_counts``."""
        self.replay = replay
        self.output = output
        self.output_rows = {rows: output[:rows] for rows in row_counts} if isinstance(output, torch.Tensor) else {}

    def release(self) -> None:
        """Forget the bound replay and output (the bucket's graph was released; its batches run eagerly)."""
        self.replay = None
        self.output = None
        self.output_rows = {}

    def rows_of(self, logits: Any, rows: int) -> Any:
        """``logits[:rows]``, a view made at capture when ``logits`` is the static output (no allocation)."""
        if logits is self.output:
            view = self.output_rows.get(rows)
            if view is not None:
                return view
        return logits[:rows]


class BaseCudaGraphRunner(abc.ABC):
    """Buckets, capture loop and teardown shared by the decode and prefill runners.

    ``backend`` defaults to ``make_backend`` for the phase's configured backend, with capture options from the
    config (``debug``, ``enable_gc``) and ``num_warmups`` eager runs before each capture (default: as many as the
    backend's correctness needs, ``cudagraph.backend.warmups_needed``); pass one to use another
    (tests pass ``cudagraph.backend.testing.CpuReplayBackend``). ``show_progress`` turns the capture progress bar on
    or off. Buckets above the phase's ``max_size`` are not captured, so batches above it run eagerly.
    ``capture_barrier`` (the breakable backend's ``CaptureOptions.barrier``) is where the ranks of a
    tensor-parallel group meet before each eager break while capturing; a barrier that is also a
    ``cudagraph.runner.agreement.RankAgreement`` shares every capture decision, so every rank captures and keeps the
    same buckets.

    Every step is routed once (``route(batch)``: the bucket to replay, or why it runs eagerly, from a table built
    after capture) and counted in ``metrics`` (pass a ``ReplayMetrics`` to keep counting into one that outlives
    the runner).
    """

    phase: ClassVar[Phase]
    inputs: StaticInputs
    """The static input buffers (allocated by the subclass for its largest bucket)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass that still overrides a method under its 0.1.0 name keeps working: the override serves under
        the new name too (the base calls the new name), with one ``DeprecationWarning`` naming the class."""
        super().__init_subclass__(**kwargs)
        for old, new in RENAMED_METHODS.items():
            if old in vars(cls) and new not in vars(cls):
                _serve_under_new_name(cls, old, new)

    def __init__(
        self,
        model_runner: ModelRunnerLike,
        config: CudaGraphConfig,
        *,
        backend: BaseCudaGraphBackend | None = None,
        show_progress: bool = True,
        num_warmups: int | None = None,
        capture_barrier: Callable[[], None] | None = None,
        metrics: ReplayMetrics | None = None,
    ) -> None:
        phase_config: PhaseConfig = config.for_phase(self.phase)
        buckets = tuple(bucket for bucket in phase_config.buckets if bucket <= phase_config.max_size)
        # The config decided whether this phase is graphed (``PhaseConfig.enabled``, with its buckets) and said why
        # not where it resolved; a runner is made only for a phase it enabled.
        assert phase_config.enabled and buckets, f"a {self.phase} runner for a phase the config does not graph"
        self.model_runner = model_runner
        self.config = config
        self.buckets: tuple[int, ...] = buckets
        """The shapes this runner captures: the phase's buckets up to its ``max_size``, ascending."""
        self.max_size: int = self.buckets[-1]
        """The largest captured bucket: static buffers are sized for it, and larger batches run eagerly."""
        self.device = torch.device(model_runner.device)
        # SGLang's --torch-compile-max-bs: compiled small batch sizes, decode only.
        compile_max_shape = config.torch_compile_max_bs if self.phase is Phase.DECODE else 0
        if num_warmups is None:
            num_warmups = warmups_needed(phase_config.backend, compile_max_shape=compile_max_shape)
        self.backend: BaseCudaGraphBackend = backend or make_backend(
            self.phase,
            phase_config.backend,
            self.device,
            options=CaptureOptions(
                num_warmups=num_warmups, debug=config.debug, freeze_gc=not config.enable_gc, barrier=capture_barrier
            ),
            tc_piecewise_compiler=config.tc_piecewise_compiler,
            compile_max_shape=compile_max_shape,
            compile_mode=config.torch_compile_mode,
            compile_cache_dir=config.compile_cache_dir,
        )
        self.show_progress = show_progress
        self.stats = CaptureStats()
        """The cost of the latest ``capture()`` (empty before the first)."""
        self.eager_reason: str | None = None
        """Why this runner fell back to eager (``capture`` could not prepare the backend), or None."""
        self.profile_trace: Path | None = None
        """Where the torch.profiler trace of the first (largest) capture went, with ``config.profile_capture``."""
        self.captured = False
        self.captured_buckets: tuple[int, ...] = ()
        """The buckets the latest ``capture()`` holds graphs of, ascending (a prefix of ``buckets`` when a memory
        budget or an out-of-memory stopped it early; empty before capture and after ``shutdown``)."""
        self.skipped_buckets: dict[int, str] = {}
        """Buckets the latest ``capture()`` left without a graph, each with why (their batches run eagerly)."""
        self.memory_budget: MemoryBudget | None = phase_config.memory_budget
        """The most device memory this runner's graphs may take (``PhaseConfig.memory_budget``; ``None``: no cap)."""
        self._memory_estimate: CaptureMemoryEstimate | None = None
        self._backend_prepared = False
        self.capture_policy: CapturePolicy = phase_config.capture_policy
        """When graphs are captured: every planned bucket in ``capture()`` (eager), or each by the first step routed
        to it (lazy; ``cudagraph.runner.lazy_capture``)."""
        self._lazy: LazyCapture | None = None
        self._pending: set[int] = set()
        """Planned buckets a step captures on first use (lazy policy; empty otherwise): read on every step."""
        self.state: RunnerState = RunnerState.AWAKE
        """Where the runner is in its life (``sleep``, ``wake``; ``cudagraph.runner.lifecycle``)."""
        self.wake_failure: str | None = None
        """Why the latest ``wake()`` could not capture (the runner then runs eagerly), or None."""
        self.graph_inputs = GraphInputGuard(functools.partial(graph_read_tensors, model_runner))
        """Where each graph's weights and caches were when it was captured (``refresh_graphs`` checks them)."""
        # bucket_by_size[n]: the bucket a batch of n replays (n = 0 is an idle batch, which replays the smallest).
        self.bucket_by_size: list[int | None] = [self.pad_to_bucket(max(n, 1)) for n in range(self.max_size + 1)]
        self.max_padding_ratio: float | None = check_padding_ratio(self.phase, phase_config.max_padding_ratio)
        """A batch whose bucket is more than this multiple of its size runs eagerly (``None``: no limit)."""
        self.metrics: ReplayMetrics = metrics if metrics is not None else ReplayMetrics(self.phase)
        """Replays per bucket and eager steps by reason, of every step this runner routed."""
        self.metrics.track_buckets(self.bucket_by_size, tokens_per_size=self._tokens_per_size())
        self._replay_attn_metadata: ReplayHook = bind_replay_hook(model_runner.attn_backend)
        """The attention backend's replay hook, taking one ``ReplayMetadata`` (a legacy positional hook adapted):
        its signature is read here, once, never per step."""
        self._close_routes()
        self._buffers_allocated = False
        self._allocate_static_buffers()
        self._buffers_allocated = True

    # -- what subclasses provide ------------------------------------------------------------------------------------

    @abc.abstractmethod
    def _allocate_static_buffers(self) -> None:
        """Allocate the static inputs for the largest bucket, filled with padding, and the attention graph state."""

    @abc.abstractmethod
    def _static_batch(self, bucket: int) -> ForwardBatch:
        """A batch of ``bucket`` rows viewing the static buffers: what the graph of that bucket is captured with."""

    def _index_static_buckets(self, attn_backend: object) -> None:
        """One ``StaticBucket`` per bucket: its static batch and the forward context its eager breaks read."""
        self.static_buckets: dict[int, StaticBucket] = {}
        for bucket in self.buckets:
            batch = self._static_batch(bucket)
            context = ForwardContext(forward_batch=batch, attn_backend=attn_backend, extra={})
            scope = _NO_CONTEXT if self._replay_reads_no_context() else ForwardContextScope(context)
            self.static_buckets[bucket] = StaticBucket(batch, context, scope)

    @abc.abstractmethod
    def shape_descriptor(self, bucket: int) -> ShapeDescriptor:
        """The bucket the graph of ``bucket`` serves (what the backend keys and dispatches its capture by)."""

    def _entry_inputs(self) -> dict[int, EntryInputs]:
        """What the backend is built with for each bucket: its descriptor, its static batch's token inputs, and one
        whole step on that batch (``prepare``'s entries)."""
        forward = self.model_runner.forward
        return {
            bucket: EntryInputs(
                self.shape_descriptor(bucket),
                (static.batch.input_ids, static.batch.positions),
                functools.partial(forward, static.batch),
            )
            for bucket, static in self.static_buckets.items()
        }

    def _replay_reads_no_context(self) -> bool:
        """Whether no forward context needs setting around a replay (the graph computes attention metadata inside)."""
        return False

    @abc.abstractmethod
    def _output_row_counts(self, bucket: int) -> Iterable[int]:
        """The row counts a replay of ``bucket`` returns (its output is sliced to them once, at capture)."""

    def _release_static_buffers(self) -> None:
        """Drop every static buffer so ``shutdown`` leaves nothing on the device."""
        self.static_buckets.clear()
        self.inputs.release()

    @abc.abstractmethod
    def _prepare_capture(self, bucket: int) -> Callable[[], torch.Tensor]:
        """Point the attention metadata at ``bucket``'s static buffers and return the forward to capture."""

    @abc.abstractmethod
    def route(self, batch: ForwardBatch) -> Route:
        """Where ``batch`` goes: the bucket whose graph replays it, or ``None`` and why it runs eagerly (a lookup in
        the table built after capture; nothing is allocated)."""

    @abc.abstractmethod
    def replay(self, batch: ForwardBatch, route: Route | None = None) -> torch.Tensor:
        """Logits of ``batch`` sliced to its real rows: its bucket's graph replays, or ``model_runner.forward`` runs
        eagerly; either way it is counted in ``metrics``. ``route`` is where the batch goes when the caller already
        asked (``route(batch)``; a batch may also carry it, ``ForwardBatch.route``); otherwise it is looked up here.

        The returned tensor views the graph's static output: the next replay overwrites it."""

    def can_run(self, batch: ForwardBatch) -> bool:
        """Whether ``batch`` can replay a captured graph (otherwise the caller runs it eagerly)."""
        return self.route(batch).bucket is not None

    # -- routing ----------------------------------------------------------------------------------------------------

    def _tokens_per_size(self) -> int:
        """Tokens a step of size 1 carries, for the metrics' token counts (a verify runner: its ``query_len``)."""
        return 1

    def _request_rows(self, bucket: int) -> int:
        """Request rows of the graph of ``bucket`` (one request per token, unless a subclass says otherwise)."""
        return bucket

    def _build_routes(self) -> None:
        """The route of every size, from the buckets the latest capture holds graphs of (end of ``capture``)."""
        table = RouteTable.build(
            self.buckets,
            self._lazy.routable if self._lazy is not None else self.captured_buckets,
            disable_padding=self.config.disable_padding,
            max_padding_ratio=self.max_padding_ratio,
            requests_of=self._request_rows,
        )
        self._set_routes(table)

    def _close_routes(self) -> None:
        """Every step eager: not captured (or fallen back to eager, when ``eager_reason`` says why)."""
        if self.state is RunnerState.ASLEEP:
            reason = EagerReason.ASLEEP
        elif self.eager_reason is not None:
            reason = EagerReason.EAGER_FALLBACK
        else:
            reason = EagerReason.NOT_CAPTURED
        self._set_routes(RouteTable.closed(reason))

    def _set_routes(self, table: RouteTable) -> None:
        self.routes: RouteTable = table
        """Every route this runner answers (see ``cudagraph.runner.routing``)."""
        # Bound apart, so ``route`` reads three attributes and one list entry.
        self._routes_by_size = table.by_size
        self._route_beyond = table.beyond
        self._route_wrong_mode = table.wrong_mode
        self._debug_replay = bool(self.backend.options.debug)

    def _taken_route(self, batch: ForwardBatch, route: Route | None) -> Route:
        """The route a step takes: ``route`` as given, else the one the batch carries, else looked up; under the lazy
        policy a bucket not captured yet is captured now (and the route says where the step goes after that)."""
        if route is None:
            route = batch.route if batch.route is not None else self.route(batch)
        if route.bucket in self._pending:
            route = self._capture_on_first_use(route)
        return route

    def _run_eagerly(self, batch: ForwardBatch, route: Route) -> torch.Tensor:
        """The eager forward of a batch routed eagerly, counted under its reason."""
        assert route.reason is not None, "an eager route always names its reason"
        if route.reason is EagerReason.ASLEEP:
            raise RunnerAsleepError(
                f"a {self.phase} step reached a runner that is asleep (its graphs and the KV cache were given "
                "back): call wake() before stepping"
            )
        self.metrics.count_eager(route.reason, batch.num_tokens)
        return self.model_runner.forward(batch)

    # -- shared -----------------------------------------------------------------------------------------------------

    def pad_to_bucket(self, size: int) -> int | None:
        """The captured bucket a batch of ``size`` replays: ``size`` itself when padding is disabled, else the
        smallest bucket that holds it; ``None`` when no bucket fits."""
        return padded_bucket(self.buckets, size, disable_padding=self.config.disable_padding)

    def capture(self) -> CaptureStats:
        """Capture the buckets, largest first, into one shared pool; log and return what it cost.

        With a memory budget (``memory_budget``) the buckets are planned from ``estimate_capture_memory()``: the
        largest are dropped until the estimate fits, and the running capture is kept within the budget by what it
        measures (``BudgetGuard`` states the rule). A capture that runs out of device memory frees the half-captured
        graph, keeps the graphs it has and skips the failing bucket and the smaller ones. Buckets left without a
        graph are in ``skipped_buckets``, named in one warning; their batches run eagerly. A capture never raises
        for lack of memory, and ``shutdown`` gives back everything it took.

        After ``shutdown`` this allocates fresh static buffers and captures again.
        """
        if self.captured or self.eager_reason is not None:
            return self.stats
        if not self._buffers_allocated:
            self._allocate_static_buffers()
            self._buffers_allocated = True
        started = time.perf_counter()
        if not self._prepare_backend():
            return self.stats
        estimate = self._memory_estimate
        if estimate is None and self.memory_budget is not None:
            estimate = self.estimate_capture_memory()
        free_at_start = self.backend.memory_reading().free_bytes
        self.graph_inputs.start_session()
        # On a tensor-parallel rank (a capture barrier that agrees) the plan and every decision of the loop are
        # shared, so every rank captures and keeps the same buckets (cudagraph.runner.agreement).
        agree = agreement_of(self.backend.options.barrier)
        plan = agreed_plan(plan_capture(self.buckets, estimate, self.memory_budget, free_at_start), self.buckets, agree)
        if self.capture_policy is CapturePolicy.LAZY:
            return self._start_lazy(LazyCapture(self, plan, estimate, free_at_start, agree), started)
        loop = CaptureLoop(
            self.backend,
            plan,
            estimate,
            free_at_start,
            self._capture_timed,
            self._release_bucket,
            self._progress,
            agree=agree,
        )
        loop.run()
        per_shape = loop.captured_stats()
        self.captured = True
        self.captured_buckets = tuple(sorted(stats.shape for stats in per_shape))
        self.skipped_buckets = dict(sorted(loop.skipped.items()))
        self._build_routes()
        compile_stats = self.backend.compile_stats
        self.stats = CaptureStats(
            per_shape=per_shape,
            seconds=time.perf_counter() - started,
            bytes=max(0, free_at_start - self.backend.memory_reading().free_bytes),
            compile_seconds=compile_stats.compile_seconds if compile_stats is not None else 0.0,
            compilations=compile_stats.compilations if compile_stats is not None else 0,
            estimate_bytes=estimate.total_bytes_for(plan.buckets) if estimate is not None and estimate.probes else None,
            skipped=dict(self.skipped_buckets),
        )
        logger.info(
            "captured %s %s graphs (%s): %s", len(per_shape), self.phase, self.backend_name, self.stats.summary()
        )
        if self.skipped_buckets:
            logger.warning(
                "%s CUDA graphs (%s): %d of %d buckets have no graph, their batches run eagerly: %s",
                self.phase,
                self.backend_name,
                len(self.skipped_buckets),
                len(self.buckets),
                skipped_summary(self.skipped_buckets),
            )
        return self.stats

    def _start_lazy(self, lazy: LazyCapture, started: float) -> CaptureStats:
        """Capture nothing now: route every planned bucket, each captured by the first step routed to it."""
        self._lazy = lazy
        self._pending = lazy.pending
        self.captured = True
        self.captured_buckets = ()
        self.skipped_buckets = dict(sorted(lazy.skipped.items()))
        self._build_routes()
        self.stats = CaptureStats(seconds=time.perf_counter() - started, skipped=dict(self.skipped_buckets))
        logger.info(
            "%s CUDA graphs (%s) capture on first use: %d buckets planned, none captured yet",
            self.phase,
            self.backend_name,
            len(lazy.pending),
        )
        return self.stats

    def _capture_on_first_use(self, route: Route) -> Route:
        """Capture ``route``'s pending bucket for the step routed to it (``cudagraph.runner.lazy_capture``); the
        route the step takes then: the same, or eager (``OVER_BUDGET``) when the bucket could not be captured."""
        lazy = self._lazy
        assert lazy is not None and route.bucket is not None
        kept = lazy.capture(route.bucket)
        self.captured_buckets = tuple(sorted(lazy.kept))
        self.skipped_buckets = dict(sorted(lazy.skipped.items()))
        if kept:
            return route
        self._build_routes()
        return Route.eager(EagerReason.OVER_BUDGET)

    # -- across the engine's life -----------------------------------------------------------------------------------

    def sleep(self) -> None:
        """Release every graph and the pool they live in (the static buffers stay); steps are refused until
        ``wake()`` (``cudagraph.runner.lifecycle``)."""
        lifecycle.sleep(self)

    def wake(self) -> RunnerState:
        """Capture again over the same static buffers (every planned bucket, or none under the lazy policy): the
        next step replays. A failure leaves the runner running eagerly, ``eager_reason`` saying why (state
        ``failed``); returns the state."""
        return lifecycle.wake(self)

    def refresh_graphs(self, *, on_moved: str = "recapture") -> tuple[int, ...]:
        """Check that every graph's weights and caches are where it was captured to read them; the buckets whose
        are not are recaptured (with ``on_moved="recapture"``, all of this runner's graphs: they share their
        record) or refused with one ``GraphInputsMovedError`` (``on_moved="raise"``). Returns the stale buckets.

        Reads every graph-read tensor once: call it when weights may have moved (``ModelRunner.update_weights`` does),
        not per step. A copy into the same memory moves nothing, so nothing is recaptured."""
        if on_moved not in ("recapture", "raise"):
            raise ValueError(f"on_moved={on_moved!r}: allowed: 'recapture', 'raise'")
        stale = self.graph_inputs.stale()
        if not stale:
            return ()
        if on_moved == "raise":
            raise moved_error(self.phase, stale)
        logger.info("%s CUDA graphs of %d buckets read moved tensors: capturing again", self.phase, len(stale))
        lifecycle.recapture(self)
        return tuple(sorted(stale))

    def _prepare_backend(self) -> bool:
        """Prepare the backend once (tc_piecewise compiles the model here); False when the model does not trace, in
        which case this runner has fallen back to eager (``eager_reason``) and says so once."""
        if self._backend_prepared:
            return True
        try:
            # The traceable part of the host's forward, for a backend that compiles it (optional for the others).
            self.backend.prepare(traceable_forward(self.model_runner), self._entry_inputs())
        except ModelTraceError as error:
            # A model the compiler cannot trace still runs: this phase falls back to eager, said once, plainly.
            self.eager_reason = f"the model does not trace for {self.backend_name}: {error}"
            logger.warning("%s CUDA graphs are off, every %s step runs eagerly: %s", self.phase, self.phase, error)
            self.shutdown()
            return False
        self._backend_prepared = True
        return True

    def estimate_capture_memory(self, *, refresh: bool = False) -> CaptureMemoryEstimate:
        """What capturing this runner's buckets will take from the free device memory, known before capturing
        them (so an engine can size its KV cache first); see ``cudagraph.runner.memory_plan`` for how.

        It captures the largest bucket and up to three smaller ones into a scratch pool of their own, reading the
        device memory around each, and frees them all before returning: nothing stays allocated. The first call
        measures (a few of the captures ``capture()`` makes, the backend's ``prepare`` included); later calls, and
        ``capture()``, reuse its result unless ``refresh``. A bucket whose probe runs out of memory is not
        estimated (``out_of_memory``), and ``capture()`` then skips it. For a model that does not trace, nothing is
        measured (``note`` says why) and the runner falls back to eager.
        """
        if self._memory_estimate is not None and not refresh:
            return self._memory_estimate
        if self.eager_reason is not None:
            return CaptureMemoryEstimate(note=self.eager_reason)
        if not self._buffers_allocated:
            self._allocate_static_buffers()
            self._buffers_allocated = True
        if not self._prepare_backend():
            return CaptureMemoryEstimate(note=self.eager_reason or "the backend could not be prepared")
        started = time.perf_counter()
        probes, out_of_memory = self._probe_captures()
        estimate = estimate_from_probes(
            self.buckets, probes, out_of_memory=out_of_memory, seconds=time.perf_counter() - started
        )
        self._memory_estimate = estimate
        return estimate

    def _probe_captures(self) -> tuple[list[ProbeCapture], list[int]]:
        """Capture ``probe_shapes`` in a scratch session and read the memory around each; the probes that fit, and
        the largest buckets that ran out of memory.

        Every bucket is warmed up once first, and each probe again just before its reading: what a first run loads
        for good (kernels loaded lazily, the capture stream's library workspaces) is then loaded before anything is
        measured, as it is before ``capture()`` measures, since the estimate runs first."""
        backend = self.backend
        probes: list[ProbeCapture] = []
        out_of_memory: list[int] = []
        shapes = list(probe_shapes(self.buckets))
        with freeze_gc(enable_gc=not backend.options.freeze_gc), backend.scratch_session():
            self._warm_up_every_bucket()
            while shapes:
                bucket = shapes.pop(0)
                before, ran_out = out_of_memory_guarded(functools.partial(self._probe_capture, bucket))
                if ran_out or before is None:
                    gc.collect()  # the failed forward's frames and tensors, now that the error is handled
                    if probes:
                        break  # a smaller probe did not fit beside the larger ones: estimate from those that did
                    out_of_memory.append(bucket)  # the largest does not fit now: probe the next largest instead
                    shapes = list(probe_shapes([smaller for smaller in self.buckets if smaller < bucket]))
                    continue
                after = backend.memory_reading()
                probes.append(
                    ProbeCapture(
                        bucket,
                        bytes=before.free_bytes - after.free_bytes,
                        peak_bytes=max(0, after.peak_allocated_bytes - before.allocated_bytes),
                        kept_bytes=after.allocated_bytes - before.allocated_bytes,
                    )
                )
        return probes, out_of_memory

    def _probe_capture(self, bucket: int) -> MemoryReading:
        """Warm ``bucket`` up, read the memory (the peak restarting), capture it; the reading before the capture."""
        forward_fn = self._prepare_capture(bucket)
        self.backend.warm_up(bucket, forward_fn)
        before = self.backend.memory_reading(reset_peak=True)
        self.backend.capture_one(bucket, forward_fn)
        return before

    def _warm_up(self, bucket: int) -> None:
        self.backend.warm_up(bucket, self._prepare_capture(bucket))

    def _warm_up_every_bucket(self) -> None:
        """One warm-up forward of each bucket, largest first (one that runs out of memory is left to its probe)."""
        ran_out = False
        for bucket in sorted(self.buckets, reverse=True):
            _, failed = out_of_memory_guarded(functools.partial(self._warm_up, bucket))
            ran_out |= failed
        if ran_out:
            gc.collect()

    def _release_bucket(self, bucket: int) -> None:
        """Free the graph of ``bucket`` and what its static bucket bound to it (the capture loop's budget rule)."""
        self.backend.discard(bucket)
        self.static_buckets[bucket].release()
        self.graph_inputs.forget(bucket)

    # -- capture: ``capture()`` for every bucket (none under ``lazy``), ``capture_bucket()`` for one -----------------

    def capture_bucket(self, bucket: int) -> torch.Tensor:
        """Capture ``bucket`` alone (inside ``capture``'s session) and return its static output."""
        forward_fn = self._prepare_capture(bucket)
        if self.backend.options.debug:
            # The backend records where the static inputs were and checks them before every replay.
            output = self.backend.capture_one(bucket, forward_fn, static_inputs=self.static_input_tensors(bucket))
        else:
            output = self.backend.capture_one(bucket, forward_fn)
        self.static_buckets[bucket].bind_replay(self.backend.replay_fn(bucket), output, self._output_row_counts(bucket))
        self.graph_inputs.record(bucket)
        return output

    def _capture_timed(self, bucket: int, first: bool = False) -> ShapeCaptureStats:
        """``capture_bucket`` and what it cost, for the capture loop and the capture on first use (``first``: the
        loop's first bucket, captured under torch.profiler when ``profile_capture`` is on)."""
        if first and self.config.profile_capture:
            with torch.profiler.profile(activities=_profiler_activities()) as profiler:
                stats = self._capture_timed(bucket)
            self._export_capture_profile(profiler, bucket)
            return stats
        started = time.perf_counter()
        # Per bucket, the allocator's reserved growth (no sync, no cache flush, so the loop stays fast); the total in
        # ``capture`` is the honest driver-side figure, which also counts instantiated graphs.
        reserved_before = self.backend.memory_reading(settle=False).reserved_bytes
        self.capture_bucket(bucket)
        used = max(0, self.backend.memory_reading(settle=False).reserved_bytes - reserved_before)
        return ShapeCaptureStats(shape=bucket, seconds=time.perf_counter() - started, bytes=used)

    def _export_capture_profile(self, profiler: torch.profiler.profile, bucket: int) -> None:
        """Write the profile of ``bucket``'s capture (``--enable-profile-cuda-graph``) and log where it went."""
        descriptor, trace = tempfile.mkstemp(prefix=f"cudagraph-capture-{self.phase}-{bucket}-", suffix=".json")
        os.close(descriptor)
        profiler.export_chrome_trace(trace)
        self.profile_trace = Path(trace)
        logger.info(
            "profile of the %s capture of bucket %s: %s (open in chrome://tracing or Perfetto)",
            self.phase,
            bucket,
            trace,
        )

    # -- replay: ``replay(batch)`` for a step, ``replay_bucket()`` for a bucket's graph alone -----------------------

    def replay_bucket(self, bucket: int) -> torch.Tensor:
        """Replay the captured ``bucket`` over whatever its static buffers hold and return its static output (in
        debug mode, after checking that the static buffers are where the graph was captured to read them)."""
        if self.backend.options.debug:
            return self.backend.replay(bucket, static_inputs=self.static_input_tensors(bucket))
        return self.backend.replay(bucket)

    def _replay_static(self, bucket: int, static_bucket: StaticBucket, rows: int) -> Any:
        """Replay ``bucket`` (its inputs loaded, its attention metadata planned) and return its first ``rows`` rows.

        The bound replay runs inside the bucket's forward context scope (eager breaks that replay through their op
        read the batch from it); debug mode goes through the backend's ``replay``, which first checks the static
        buffer addresses. A bucket whose replay reads no context skips the ``with`` (a no-op block costs host time
        on every step)."""
        scope = static_bucket.context_scope
        if self._debug_replay:
            self.graph_inputs.check(bucket, self.phase)
            with self.backend.runtime_session(), scope:
                logits = self.replay_bucket(bucket)
        elif scope is _NO_CONTEXT:
            logits = static_bucket.replay()  # type: ignore[misc]  # bound at capture
        else:
            with scope:
                logits = static_bucket.replay()  # type: ignore[misc]  # bound at capture
        return static_bucket.rows_of(logits, rows)

    def static_input_tensors(self, bucket: int) -> list[torch.Tensor]:
        """The static buffers the graph of ``bucket`` reads (checked against capture-time addresses in debug mode)."""
        return list(self.inputs.tensors.values())

    # -- names of an earlier release, kept one release with a warning ------------------------------------------------

    def capture_one_shape(self, shape: int) -> torch.Tensor:
        """Deprecated alias of ``capture_bucket`` (removed in 1.0.0)."""
        _warn_renamed("capture_one_shape", "capture_bucket")
        return _beneath(self, "capture_bucket")(self, shape)

    def replay_graph(self, shape: int) -> torch.Tensor:
        """Deprecated alias of ``replay_bucket`` (removed in 1.0.0)."""
        _warn_renamed("replay_graph", "replay_bucket")
        return _beneath(self, "replay_bucket")(self, shape)

    def replay_routed(self, batch: ForwardBatch, route: Route) -> torch.Tensor:
        """Deprecated alias of ``replay(batch, route)`` (removed in 1.0.0)."""
        _warn_renamed("replay_routed", "replay")
        return _beneath(self, "replay")(self, batch, route)

    def _progress(self, shapes: list[int]) -> Iterable[int]:
        # SGLang's wording, which users grep for: "Capturing batches (bs=8 avail_mem=71.20 GiB)".
        what, key = ("batches", "bs") if self.phase is Phase.DECODE else ("tokens", "num_tokens")
        bar = tqdm(shapes, desc=f"Capturing {what}", unit="graph", disable=not self.show_progress, leave=False)
        for bucket in bar:
            if self.show_progress:
                free = self.backend.memory_reading(settle=False).free_bytes
                bar.set_description(f"Capturing {what} ({key}={bucket} avail_mem={free / 2**30:.2f} GiB)")
            yield bucket

    @property
    def recompiles_at_replay(self) -> int:
        """Times the compiled model forward compiled again after capture (0 for a backend that compiles nothing).

        Each one is a dynamo guard that failed at replay, so steps ran without their graphs: a bug to report.
        """
        compile_stats = self.backend.compile_stats
        return compile_stats.recompiles_at_replay if compile_stats is not None else 0

    @property
    def backend_name(self) -> str:
        """The configured backend of this runner's phase."""
        return str(self.config.backend(self.phase))

    def shutdown(self) -> None:
        """Free graphs, static outputs, static buffers and the pool reference; ``capture`` starts over afterwards.

        The static buffers go first, so that the backend's cleanup, which returns the allocator's cached blocks to
        the device, returns theirs too: afterwards the device has back every byte the runner took (the estimate's
        probes included; the engine's own state, and what a first run loads for the life of the process, aside).
        """
        self._release_static_buffers()
        self.backend.cleanup()
        self._buffers_allocated = False
        self.captured = False
        self.captured_buckets = ()
        self.skipped_buckets = {}
        self.graph_inputs.clear()
        self._lazy = None
        self._pending = set()
        self._close_routes()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(backend={self.backend_name}, buckets={list(self.buckets)}, "
            f"captured={self.captured})"
        )
