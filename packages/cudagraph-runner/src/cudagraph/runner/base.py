"""The part every runner shares: buckets, the capture loop, capture stats and teardown.

The loop captures largest shape first into the backend's one shared pool with the garbage collector frozen, so the
smaller graphs reuse the memory the largest one reserved. Subclasses own their static buffers and say how one shape
is fed (``_prepare_capture``) and replayed (``replay``). Everything device-specific (capturing, replaying, reading
memory) is the backend's: this module runs the same code whatever backend it is given.

Replay is the hot path: whatever a step needs that does not depend on the step (the static batch, the forward
context's ``with`` block, the backend's bound replay, the output sliced to each batch size) is made once per bucket
at capture and kept in its ``StaticBucket``, so a step only copies inputs, refreshes attention metadata and replays.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from tqdm import tqdm

from cudagraph.backend import BaseCudaGraphBackend, ModelTraceError, make_backend, warmups_needed
from cudagraph.backend_utils import CaptureOptions, ForwardContext, ForwardContextScope, freeze_gc
from cudagraph.config import ConfigError, CudaGraphConfig, Phase, PhaseConfig

from .buckets import pad_to_bucket
from .forward_batch import ForwardBatch
from .protocols import ModelRunnerLike
from .static_buffers import StaticInputs
from .stats import CaptureStats, ShapeCaptureStats

logger = logging.getLogger(__name__)


_NO_CONTEXT = contextlib.nullcontext()
"""The ``with`` block of a bucket whose replay reads no forward context (stateless, so one serves every bucket)."""


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
    tensor-parallel group meet before each eager break while capturing.
    """

    phase: ClassVar[Phase]
    inputs: StaticInputs
    """The static input buffers (allocated by the subclass for its largest bucket)."""

    def __init__(
        self,
        model_runner: ModelRunnerLike,
        config: CudaGraphConfig,
        *,
        backend: BaseCudaGraphBackend | None = None,
        show_progress: bool = True,
        num_warmups: int | None = None,
        capture_barrier: Callable[[], None] | None = None,
    ) -> None:
        phase_config: PhaseConfig = config.for_phase(self.phase)
        buckets = tuple(bucket for bucket in phase_config.buckets if bucket <= phase_config.max_size)
        if not phase_config.enabled or not buckets:
            raise ConfigError(
                f"{self.phase} CUDA graphs are disabled in this config (backend {phase_config.backend}, "
                f"buckets {list(phase_config.buckets)}, max size {phase_config.max_size}); run {self.phase} eagerly "
                f"instead of creating a runner"
            )
        self.model_runner = model_runner
        self.config = config
        self.buckets: tuple[int, ...] = buckets
        """The shapes this runner captures: the phase's buckets up to its ``max_size``, ascending."""
        self.max_size: int = self.buckets[-1]
        """The largest captured shape: static buffers are sized for it, and larger batches run eagerly."""
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
        # bucket_by_size[n]: the bucket a batch of n replays (n = 0 is an idle batch, which replays the smallest).
        self.bucket_by_size: list[int | None] = [self.pad_to_bucket(max(n, 1)) for n in range(self.max_size + 1)]
        self._buffers_allocated = False
        self._allocate_static_buffers()
        self._buffers_allocated = True

    # -- what subclasses provide ------------------------------------------------------------------------------------

    @abc.abstractmethod
    def _allocate_static_buffers(self) -> None:
        """Allocate the static inputs for the largest bucket, filled with padding, and the attention graph state."""

    @abc.abstractmethod
    def _static_batch(self, bucket: int) -> ForwardBatch:
        """A batch of ``bucket`` rows viewing the static buffers: what the graph of that shape is captured with."""

    def _index_static_buckets(self, attn_backend: object) -> None:
        """One ``StaticBucket`` per bucket: its static batch and the forward context its eager breaks read."""
        self.static_buckets: dict[int, StaticBucket] = {}
        for bucket in self.buckets:
            batch = self._static_batch(bucket)
            context = ForwardContext(forward_batch=batch, attn_backend=attn_backend, extra={})
            scope = _NO_CONTEXT if self._replay_reads_no_context() else ForwardContextScope(context)
            self.static_buckets[bucket] = StaticBucket(batch, context, scope)

    def _replay_reads_no_context(self) -> bool:
        """Whether no forward context needs setting around a replay (the graph computes attention metadata inside)."""
        return False

    @abc.abstractmethod
    def _output_row_counts(self, shape: int) -> Iterable[int]:
        """The row counts a replay of ``shape`` returns (its output is sliced to them once, at capture)."""

    def _release_static_buffers(self) -> None:
        """Drop every static buffer so ``shutdown`` leaves nothing on the device."""
        self.static_buckets.clear()
        self.inputs.release()

    @abc.abstractmethod
    def _prepare_capture(self, shape: int) -> Callable[[], torch.Tensor]:
        """Point the attention metadata at ``shape``'s static buffers and return the forward to capture."""

    @abc.abstractmethod
    def can_run(self, batch: ForwardBatch) -> bool:
        """Whether ``batch`` can replay a captured graph (otherwise the caller runs it eagerly)."""

    @abc.abstractmethod
    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits of ``batch`` sliced to its real rows (eager forward when ``can_run`` is false)."""

    # -- shared -----------------------------------------------------------------------------------------------------

    def pad_to_bucket(self, size: int) -> int | None:
        """The captured shape a batch of ``size`` replays: ``size`` itself when padding is disabled, else the
        smallest bucket that holds it; ``None`` when no bucket fits."""
        if self.config.disable_padding:
            return size if size in self.buckets else None
        return pad_to_bucket(self.buckets, size)

    def capture(self) -> CaptureStats:
        """Capture every bucket, largest first, into one shared pool; log and return what it cost.

        After ``shutdown`` this allocates fresh static buffers and captures again.
        """
        if self.captured:
            return self.stats
        if not self._buffers_allocated:
            self._allocate_static_buffers()
            self._buffers_allocated = True
        per_shape: list[ShapeCaptureStats] = []
        started = time.perf_counter()
        try:
            self.backend.prepare(self)
        except ModelTraceError as error:
            # A model the compiler cannot trace still runs: this phase falls back to eager, said once, plainly.
            self.eager_reason = f"the model does not trace for {self.backend_name}: {error}"
            logger.warning("%s CUDA graphs are off, every %s step runs eagerly: %s", self.phase, self.phase, error)
            self.shutdown()
            return self.stats
        free_at_start = self.backend.memory_reading().free_bytes
        with freeze_gc(enable_gc=not self.backend.options.freeze_gc), self.backend.capture_session():
            for index, shape in enumerate(self._progress(sorted(self.buckets, reverse=True))):
                if index == 0 and self.config.profile_capture:
                    per_shape.append(self._profiled_capture(shape))
                else:
                    per_shape.append(self._capture_one_shape(shape))
        self.captured = True
        self.captured_buckets = tuple(sorted(stats.shape for stats in per_shape))
        self.skipped_buckets = {}
        compile_stats = self.backend.compile_stats
        self.stats = CaptureStats(
            per_shape=tuple(per_shape),
            seconds=time.perf_counter() - started,
            bytes=max(0, free_at_start - self.backend.memory_reading().free_bytes),
            compile_seconds=compile_stats.compile_seconds if compile_stats is not None else 0.0,
            compilations=compile_stats.compilations if compile_stats is not None else 0,
        )
        logger.info(
            "captured %s %s graphs (%s): %s", len(self.buckets), self.phase, self.backend_name, self.stats.summary()
        )
        return self.stats

    def _profiled_capture(self, shape: int) -> ShapeCaptureStats:
        """Capture ``shape`` under torch.profiler (``--enable-profile-cuda-graph``) and log where the trace went."""
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as profiler:
            stats = self._capture_one_shape(shape)
        descriptor, trace = tempfile.mkstemp(prefix=f"cudagraph-capture-{self.phase}-{shape}-", suffix=".json")
        os.close(descriptor)
        profiler.export_chrome_trace(trace)
        self.profile_trace = Path(trace)
        logger.info(
            "profile of the %s capture of shape %s: %s (open in chrome://tracing or Perfetto)", self.phase, shape, trace
        )
        return stats

    def capture_one_shape(self, shape: int) -> torch.Tensor:
        """Capture ``shape`` alone (inside ``capture``'s session) and return its static output."""
        forward_fn = self._prepare_capture(shape)
        if self.backend.options.debug:
            # The backend records where the static inputs were and checks them before every replay.
            output = self.backend.capture_one(shape, forward_fn, static_inputs=self.static_input_tensors(shape))
        else:
            output = self.backend.capture_one(shape, forward_fn)
        self.static_buckets[shape].bind_replay(self.backend.replay_fn(shape), output, self._output_row_counts(shape))
        return output

    def replay_graph(self, shape: int) -> torch.Tensor:
        """Replay the captured ``shape`` and return its static output (in debug mode, after checking that the static
        buffers are where the graph was captured to read them)."""
        if self.backend.options.debug:
            return self.backend.replay(shape, static_inputs=self.static_input_tensors(shape))
        return self.backend.replay(shape)

    def _replay_bucket(self, shape: int, static_bucket: StaticBucket, rows: int) -> Any:
        """Replay ``shape`` (its inputs loaded, its attention metadata planned) and return its first ``rows`` rows.

        The bound replay runs inside the bucket's forward context scope (eager breaks that replay through their op
        read the batch from it); debug mode goes through the backend's ``replay``, which first checks the static
        buffer addresses."""
        if self.backend.options.debug:
            with self.backend.runtime_session(), static_bucket.context_scope:
                logits = self.replay_graph(shape)
        else:
            with static_bucket.context_scope:
                logits = static_bucket.replay()  # type: ignore[misc]  # bound at capture
        return static_bucket.rows_of(logits, rows)

    def static_input_tensors(self, shape: int) -> list[torch.Tensor]:
        """The static buffers the graph of ``shape`` reads (checked against capture-time addresses in debug mode)."""
        return list(self.inputs.tensors.values())

    def _capture_one_shape(self, shape: int) -> ShapeCaptureStats:
        started = time.perf_counter()
        # Per shape, the allocator's reserved growth (no sync, no cache flush, so the loop stays fast); the total in
        # ``capture`` is the honest driver-side figure, which also counts instantiated graphs.
        reserved_before = self.backend.memory_reading(settle=False).reserved_bytes
        self.capture_one_shape(shape)
        used = max(0, self.backend.memory_reading(settle=False).reserved_bytes - reserved_before)
        return ShapeCaptureStats(shape=shape, seconds=time.perf_counter() - started, bytes=used)

    def _progress(self, shapes: list[int]) -> Iterable[int]:
        # SGLang's wording, which users grep for: "Capturing batches (bs=8 avail_mem=71.20 GiB)".
        what, key = ("batches", "bs") if self.phase is Phase.DECODE else ("tokens", "num_tokens")
        bar = tqdm(shapes, desc=f"Capturing {what}", unit="graph", disable=not self.show_progress, leave=False)
        for shape in bar:
            if self.show_progress:
                free = self.backend.memory_reading(settle=False).free_bytes
                bar.set_description(f"Capturing {what} ({key}={shape} avail_mem={free / 2**30:.2f} GiB)")
            yield shape

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
        """Free graphs, static outputs, static buffers and the pool reference; ``capture`` starts over afterwards."""
        self.backend.cleanup()
        self._release_static_buffers()
        self._buffers_allocated = False
        self.captured = False
        self.captured_buckets = ()
        self.skipped_buckets = {}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(backend={self.backend_name}, buckets={list(self.buckets)}, "
            f"captured={self.captured})"
        )
