"""The part every runner shares: route, copy in, replay; and the capture that makes the graphs replayed.

A step is routed once (``route``, or the route its batch carries), copied into the static buffers, its attention
metadata refreshed, and its bucket's graph replayed (``replay``, in the subclasses). What is captured (the static
buckets, their graphs, the route table, the addresses the graphs read) is one ``StaticBuckets``
(``cudagraph.runner.static_buckets``) that capture, the capture on first use and sleep and wake share; this module
plans a capture and hands each bucket to it. Everything device-specific (capturing, replaying, reading memory) is
the backend's: this module runs the same code whatever backend it is given.
"""

from __future__ import annotations

import abc
import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch

from cudagraph.backend import BaseCudaGraphBackend, make_backend, warmups_needed
from cudagraph.backend_utils import CaptureOptions, ShapeDescriptor
from cudagraph.config import CapturePolicy, CudaGraphConfig, MemoryBudget, Phase, PhaseConfig

from .forward_batch import ForwardBatch
from .graph_inputs import GraphInputGuard, graph_read_tensors
from .lazy_capture import LazyCapture
from .lifecycle import RunnerAsleepError, RunnerLifecycle, RunnerState
from .memory_plan import CaptureMemoryEstimate
from .metrics import ReplayMetrics
from .protocols import ModelRunnerLike
from .renamed_methods import RenamedMethods
from .replay_metadata import ReplayHook, bind_replay_hook
from .routing import EagerReason, Route, RouteTable, padded_bucket
from .static_buckets import NO_CONTEXT, StaticBucket, StaticBuckets
from .static_buffers import StaticBuffers
from .stats import CaptureStats
from .switches import RunnerConfig, runner_config

logger = logging.getLogger(__name__)

__all__ = ["BaseCudaGraphRunner", "StaticBucket"]


class BaseCudaGraphRunner(RunnerLifecycle, RenamedMethods, abc.ABC):
    """Route, copy in and replay, shared by the decode and prefill runners, and the capture that feeds them.

    Built with a ``RunnerConfig`` (its phase's ``PhaseConfig`` and the engine-wide ``RunnerSwitches``), a bare
    ``PhaseConfig``, or a whole ``CudaGraphConfig`` (from which both are selected once). ``backend`` defaults to
    ``make_backend`` for the phase's backend with ``num_warmups`` eager runs before each capture (default:
    ``warmups_needed``); tests pass ``cudagraph.backend.testing.CpuReplayBackend``. ``capture_barrier`` is where
    the ranks of a tensor-parallel group meet while capturing (a ``RankAgreement`` also shares every capture
    decision). Every step is counted in ``metrics`` (pass one to keep counting into one that outlives the runner).
    """

    phase: ClassVar[Phase]
    static_buffers: StaticBuffers
    """The static buffers every graph reads (allocated by the subclass for its largest bucket)."""

    def __init__(
        self,
        model_runner: ModelRunnerLike,
        config: CudaGraphConfig | PhaseConfig | RunnerConfig,
        *,
        backend: BaseCudaGraphBackend | None = None,
        show_progress: bool = True,
        num_warmups: int | None = None,
        capture_barrier: Callable[[], None] | None = None,
        metrics: ReplayMetrics | None = None,
    ) -> None:
        settings = runner_config(config, self.phase)
        phase_config, self.switches = settings.phase, settings.switches
        # The config decided whether this phase is graphed, and with which buckets (``resolve``: ascending, the last
        # one ``max_size``); a runner is made only for a phase it enabled.
        assert phase_config.enabled and phase_config.buckets, (
            f"a {self.phase} runner for a phase the config does not graph"
        )
        self.model_runner = model_runner
        self.phase_config: PhaseConfig = phase_config
        self.buckets: tuple[int, ...] = phase_config.buckets
        """The buckets this runner captures, ascending, as the config resolved them."""
        self.max_size: int = self.buckets[-1]
        """The largest bucket: static buffers are sized for it, and larger batches run eagerly."""
        self.max_padding_ratio: float | None = phase_config.max_padding_ratio
        """A batch whose bucket is more than this multiple of its size runs eagerly (``None``: no limit)."""
        self.memory_budget: MemoryBudget | None = phase_config.memory_budget
        self.capture_policy: CapturePolicy = phase_config.capture_policy
        self.device = torch.device(model_runner.device)
        self.backend: BaseCudaGraphBackend = backend or self._make_backend(capture_barrier, num_warmups)
        self.show_progress = show_progress
        self.stats = CaptureStats()
        """The cost of the latest ``capture()`` (empty before the first)."""
        self.eager_reason: str | None = None
        """Why this runner fell back to eager (``capture`` could not prepare the backend), or None."""
        self.captured = False
        self.captured_buckets: tuple[int, ...] = ()
        """The buckets holding graphs, ascending (a prefix of ``buckets`` when a memory budget or an out-of-memory
        stopped the capture early; empty before capture and after ``shutdown``)."""
        self.skipped_buckets: dict[int, str] = {}
        """Buckets the latest ``capture()`` left without a graph, each with why (their batches run eagerly)."""
        self.state: RunnerState = RunnerState.AWAKE
        self.wake_failure: str | None = None
        """Why the latest ``wake()`` could not capture (the runner then runs eagerly), or None."""
        self.graphs_kept = False
        """Asleep with its graphs kept (``sleep(keep_graphs=True)``): ``wake()`` reopens their routes, nothing else."""
        self.graph_inputs = GraphInputGuard(functools.partial(graph_read_tensors, model_runner))
        self.static_buckets = StaticBuckets(
            self.backend,
            self.graph_inputs,
            self.capture_bucket,
            phase=self.phase,
            profile_capture=self.switches.profile_capture,
        )
        """What is captured: every bucket's static batch and bound replay, the route table, the address record."""
        self.metrics: ReplayMetrics = metrics if metrics is not None else ReplayMetrics(self.phase)
        bucket_of_size = [self.pad_to_bucket(max(size, 1)) for size in range(self.max_size + 1)]
        self.metrics.track_buckets(bucket_of_size, tokens_per_size=self._tokens_per_size())
        # The attention backend's replay hook, taking one ``ReplayMetadata`` (a legacy positional hook adapted).
        self._replay_attn_metadata: ReplayHook = bind_replay_hook(model_runner.attn_backend)
        self._memory_estimate: CaptureMemoryEstimate | None = None
        self._backend_prepared = False
        self._lazy: LazyCapture | None = None
        self._debug_replay = bool(self.backend.options.debug)
        self._allocate_static_buffers()
        self._buffers_allocated = True

    def _make_backend(self, barrier: Callable[[], None] | None, num_warmups: int | None) -> BaseCudaGraphBackend:
        switches, backend = self.switches, self.phase_config.backend
        if num_warmups is None:
            num_warmups = warmups_needed(backend, compile_max_shape=switches.compile_max_size)
        options = CaptureOptions(
            num_warmups=num_warmups, debug=switches.debug, freeze_gc=not switches.enable_gc, barrier=barrier
        )
        return make_backend(
            self.phase,
            backend,
            self.device,
            options=options,
            tc_piecewise_compiler=switches.tc_piecewise_compiler,
            compile_max_shape=switches.compile_max_size,
            compile_mode=switches.torch_compile_mode,
            compile_cache_dir=switches.compile_cache_dir,
        )

    # -- what subclasses provide ------------------------------------------------------------------------------------

    @abc.abstractmethod
    def _allocate_static_buffers(self) -> None:
        """Allocate the static buffers for the largest bucket, the attention graph state, and index the buckets."""

    @abc.abstractmethod
    def _static_batch(self, bucket: int) -> ForwardBatch:
        """A batch of ``bucket`` rows viewing the static buffers: what the graph of that bucket is captured with."""

    @abc.abstractmethod
    def shape_descriptor(self, bucket: int) -> ShapeDescriptor:
        """What the graph of ``bucket`` serves (what the backend keys and dispatches its capture by)."""

    @abc.abstractmethod
    def _output_row_counts(self, bucket: int) -> Iterable[int]:
        """The row counts a replay of ``bucket`` returns (its output is sliced to them once, at capture)."""

    @abc.abstractmethod
    def _prepare_capture(self, bucket: int) -> Callable[[], torch.Tensor]:
        """Point the attention metadata at ``bucket``'s static buffers and return the forward to capture."""

    @abc.abstractmethod
    def route(self, batch: ForwardBatch) -> Route:
        """Where ``batch`` goes: the bucket whose graph replays it, or ``None`` and why it runs eagerly."""

    @abc.abstractmethod
    def replay(self, batch: ForwardBatch, route: Route | None = None) -> torch.Tensor:
        """Logits of ``batch`` sliced to its real rows: its bucket's graph replays, or ``model_runner.forward`` runs
        eagerly; either way it is counted in ``metrics``. ``route``: the step's route when the caller has it (else
        the one the batch carries, else looked up: ``_taken_route``). The result views the graph's static output."""

    def _tokens_per_size(self) -> int:
        """Tokens a step of size 1 carries, for the metrics' token counts (a verify runner: its ``query_len``)."""
        return 1

    def _request_rows(self, bucket: int) -> int:
        """Request rows of the graph of ``bucket`` (one request per token, unless a subclass says otherwise)."""
        return bucket

    def _replay_reads_no_context(self) -> bool:
        """Whether no forward context needs setting around a replay (the graph computes attention metadata inside)."""
        return False

    def _index_buckets(self) -> None:
        """Fresh static buckets over the static buffers (at allocation, and before capturing again after sleep)."""
        scoped = not self._replay_reads_no_context()
        attn_backend = self.model_runner.attn_backend
        self.static_buckets.index(self.static_buffers, self.buckets, self._static_batch, attn_backend, scoped=scoped)

    # -- route --------------------------------------------------------------------------------------------------------

    def pad_to_bucket(self, size: int) -> int | None:
        """The bucket a batch of ``size`` pads to: ``size`` itself when padding is disabled, else the smallest
        bucket that holds it; ``None`` when none does."""
        return padded_bucket(self.buckets, size, disable_padding=self.switches.disable_padding)

    def can_run(self, batch: ForwardBatch) -> bool:
        """Whether ``batch`` can replay a captured graph (otherwise the caller runs it eagerly)."""
        return self.route(batch).bucket is not None

    @property
    def routes(self) -> RouteTable:
        """Every route this runner answers (see ``cudagraph.runner.routing``)."""
        return self.static_buckets.routes

    def _open_routes(self) -> None:
        """Route every size from the buckets holding graphs, or pending under the lazy policy."""
        lazy = self._lazy
        routable = lazy.routable if lazy is not None else self.captured_buckets
        table = RouteTable.build(
            self.buckets,
            routable,
            disable_padding=self.switches.disable_padding,
            max_padding_ratio=self.max_padding_ratio,
            requests_of=self._request_rows,
        )
        self.static_buckets.open_routes(table)

    def _close_routes(self) -> None:
        """Every step eager: asleep, fallen back to eager (``eager_reason``), or not captured."""
        if self.state is RunnerState.ASLEEP:
            reason = EagerReason.ASLEEP
        else:
            reason = EagerReason.NOT_CAPTURED if self.eager_reason is None else EagerReason.EAGER_FALLBACK
        self.static_buckets.close_routes(reason)

    def _taken_route(self, batch: ForwardBatch, route: Route | None) -> Route:
        """The one fallback rule: ``route`` as given, else the one the batch carries, else looked up; under the lazy
        policy a pending bucket is captured now (the route then says where the step goes)."""
        if route is None:
            route = batch.route if batch.route is not None else self.route(batch)
        if route.bucket in self.static_buckets.pending:
            lazy = self._lazy
            assert lazy is not None
            kept = lazy.capture(route.bucket)
            self.captured_buckets, self.skipped_buckets = tuple(sorted(lazy.kept)), dict(sorted(lazy.skipped.items()))
            if not kept:
                self._open_routes()
                return Route.eager(EagerReason.OVER_BUDGET)
        return route

    # -- replay -------------------------------------------------------------------------------------------------------

    def _replay_static(self, bucket: int, static_bucket: StaticBucket, rows: int) -> Any:
        """Replay ``bucket`` (inputs copied in, attention metadata refreshed) and return its first ``rows`` rows.

        The bound replay runs inside the bucket's forward context scope, skipped when it reads no context (a no-op
        block costs host time every step); debug mode goes through ``replay_bucket``, which checks addresses."""
        scope = static_bucket.context_scope
        if self._debug_replay:
            self.graph_inputs.check(bucket, self.phase)
            with self.backend.runtime_session(), scope:
                logits = self.replay_bucket(bucket)
        elif scope is NO_CONTEXT:
            logits = static_bucket.replay()  # type: ignore[misc]  # bound at capture
        else:
            with scope:
                logits = static_bucket.replay()  # type: ignore[misc]  # bound at capture
        return static_bucket.rows_of(logits, rows)

    def replay_bucket(self, bucket: int) -> torch.Tensor:
        """Replay the captured ``bucket`` over whatever its static buffers hold; its static output (in debug mode,
        after checking the static buffers are where the graph was captured to read them)."""
        if self.backend.options.debug:
            return self.backend.replay(bucket, static_inputs=self.static_buffer_tensors(bucket))
        return self.backend.replay(bucket)

    def _run_eagerly(self, batch: ForwardBatch, route: Route) -> torch.Tensor:
        """The eager forward of a batch routed eagerly, counted under its reason."""
        assert route.reason is not None, "an eager route always names its reason"
        if route.reason is EagerReason.ASLEEP:
            raise RunnerAsleepError(
                f"a {self.phase} step reached a runner that is asleep (its graphs and the KV cache were given "
                "back): call wake() before stepping"
            )
        self.metrics.count_eager(route.reason, batch.num_tokens)
        return self._forward_eagerly(batch)

    def _forward_eagerly(self, batch: ForwardBatch) -> Any:
        """The eager step of ``batch``: what a graph of it replays (the model runner's forward, unless a runner's
        step is more than one forward)."""
        return self.model_runner.forward(batch)

    def static_buffer_tensors(self, bucket: int) -> list[torch.Tensor]:
        """The static buffers the graph of ``bucket`` reads (checked against capture-time addresses in debug mode)."""
        return list(self.static_buffers.tensors.values())

    @property
    def backend_name(self) -> str:
        """The configured backend of this runner's phase."""
        return str(self.phase_config.backend)

    def shutdown(self) -> None:
        """Free graphs, static outputs, static buffers and the pool reference; ``capture`` starts over afterwards.
        The static buffers go first, so the backend's cleanup returns their blocks to the device too."""
        self.static_buckets.clear()
        self.static_buffers.release()
        self._buffers_allocated = False
        self._release_graphs()
        self._close_routes()

    def __repr__(self) -> str:
        name, buckets = type(self).__name__, list(self.buckets)
        return f"{name}(backend={self.backend_name}, buckets={buckets}, captured={self.captured})"
