"""A runner's capture: planning its buckets and capturing them into its ``StaticBuckets``, at start-up or on first
use, and the memory estimate made before.

``RunnerCapture`` is the capture half of ``BaseCudaGraphRunner`` (which routes, copies in and replays): a mixin of
that one class, kept apart so each half reads on its own. It decides nothing about a step; it fills what the steps
replay:

1. ``_prepare_backend``: the backend is built once with the traceable forward and every bucket's entry (a model that
   does not trace falls back to eager here, said once).
2. ``plan_capture``: the buckets that fit the memory budget (``estimate_capture_memory`` first, when there is one),
   shared with the other ranks of a tensor-parallel group (``agreed_plan``).
3. The eager policy runs the ``CaptureLoop`` over the runner's ``StaticBuckets``; the lazy one leaves every planned
   bucket pending for ``LazyCapture``. Either way the route table is opened after.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
from tqdm import tqdm

from cudagraph.backend import BaseCudaGraphBackend, EntryInputs, ModelTraceError
from cudagraph.backend_utils import ShapeDescriptor
from cudagraph.config import CapturePolicy, MemoryBudget, Phase

from .agreement import agreed_plan, agreement_of
from .capture_loop import CaptureLoop
from .forward_batch import ForwardBatch
from .graph_inputs import GraphInputGuard
from .lazy_capture import LazyCapture
from .memory_plan import CaptureMemoryEstimate, estimate_from_probes, plan_capture, skipped_summary
from .memory_probe import probe_captures
from .metrics import ReplayMetrics
from .protocols import ModelRunnerLike, traceable_forward
from .static_buckets import StaticBuckets
from .stats import CaptureStats

logger = logging.getLogger(__name__)


class RunnerCapture:
    """The capture half of ``BaseCudaGraphRunner`` (see the module docstring)."""

    if TYPE_CHECKING:  # what it reads and calls of the one class it is mixed into (``BaseCudaGraphRunner``)
        phase: ClassVar[Phase]
        model_runner: ModelRunnerLike
        backend: BaseCudaGraphBackend
        buckets: tuple[int, ...]
        memory_budget: MemoryBudget | None
        capture_policy: CapturePolicy
        metrics: ReplayMetrics
        show_progress: bool
        stats: CaptureStats
        eager_reason: str | None
        captured: bool
        captured_buckets: tuple[int, ...]
        skipped_buckets: dict[int, str]
        graph_inputs: GraphInputGuard
        static_buckets: StaticBuckets
        _lazy: LazyCapture | None
        _memory_estimate: CaptureMemoryEstimate | None
        _backend_prepared: bool
        _buffers_allocated: bool

        @property
        def backend_name(self) -> str: ...  # noqa: D102
        def shape_descriptor(self, bucket: int) -> ShapeDescriptor: ...  # noqa: D102
        def static_buffer_tensors(self, bucket: int) -> list[torch.Tensor]: ...  # noqa: D102
        def shutdown(self) -> None: ...  # noqa: D102
        def _allocate_static_buffers(self) -> None: ...
        def _prepare_capture(self, bucket: int) -> Callable[[], torch.Tensor]: ...
        def _output_row_counts(self, bucket: int) -> Iterable[int]: ...
        def _open_routes(self) -> None: ...
        def _forward_eagerly(self, batch: ForwardBatch) -> torch.Tensor: ...

    def _traced_forward(self) -> Callable[..., torch.Tensor] | None:
        """The forward a compiling backend traces (the model runner's ``model_forward``, when it offers one)."""
        return traceable_forward(self.model_runner)

    @staticmethod
    def _traced_inputs(batch: ForwardBatch) -> tuple[torch.Tensor, ...]:
        """What ``_traced_forward`` is called with for ``batch`` (its token dimension first in each)."""
        return (batch.input_ids, batch.positions)

    def capture_bucket(self, bucket: int) -> torch.Tensor:
        """Capture ``bucket`` alone (inside ``capture``'s session) and return its static output."""
        static_inputs = self.static_buffer_tensors(bucket) if self.backend.options.debug else None
        forward_fn = self._prepare_capture(bucket)
        return self.static_buckets.bind(bucket, forward_fn, self._output_row_counts(bucket), static_inputs)  # type: ignore[no-any-return]

    def capture(self) -> CaptureStats:
        """Capture the buckets, largest first, into one shared pool; log and return what it cost.

        With a memory budget the buckets are planned from ``estimate_capture_memory()``, and the loop keeps within
        it (``cudagraph.runner.capture_loop``); an out-of-memory keeps the graphs captured and skips the rest.
        Buckets left without a graph are in ``skipped_buckets``; their batches run eagerly. Under the lazy policy
        nothing is captured now (``cudagraph.runner.lazy_capture``). After ``shutdown`` it starts over."""
        if self.captured or self.eager_reason is not None:
            return self.stats
        self._ensure_buffers()
        started = time.perf_counter()
        if not self._prepare_backend():
            return self.stats
        estimate = self._memory_estimate
        if estimate is None and self.memory_budget is not None:
            estimate = self.estimate_capture_memory()
        free_at_start = self.backend.memory_reading().free_bytes
        self.graph_inputs.start_session()
        # On a tensor-parallel rank the plan and every decision of the loop are shared (cudagraph.runner.agreement).
        agree = agreement_of(self.backend.options.barrier)
        plan = agreed_plan(plan_capture(self.buckets, estimate, self.memory_budget, free_at_start), self.buckets, agree)
        buckets, self.captured = self.static_buckets, True
        if self.capture_policy is CapturePolicy.LAZY:
            self._lazy = LazyCapture(
                buckets, plan, estimate, free_at_start, agree, metrics=self.metrics, backend_name=self.backend_name
            )
            self.stats = CaptureStats(seconds=time.perf_counter() - started, skipped=dict(sorted(plan.skipped.items())))
        else:
            loop = CaptureLoop(buckets, plan, estimate, free_at_start, self._progress, agree=agree)
            loop.run()
            self.stats = loop.stats(started, free_at_start, estimate, self.backend.compile_stats)
            self.captured_buckets = tuple(sorted(loop.kept))
        self.skipped_buckets = dict(self.stats.skipped)
        self._open_routes()
        if self._lazy is not None:
            logger.info(
                "%s CUDA graphs (%s) capture on first use: %d buckets planned, none captured yet",
                self.phase,
                self.backend_name,
                len(plan.buckets),
            )
            return self.stats
        logger.info(
            "captured %s %s graphs (%s): %s", self.stats.graphs, self.phase, self.backend_name, self.stats.summary()
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

    def _ensure_buffers(self) -> None:
        if not self._buffers_allocated:
            self._allocate_static_buffers()
            self._buffers_allocated = True

    def _prepare_backend(self) -> bool:
        """Prepare the backend once (tc_piecewise compiles the model here); False when the model does not trace, in
        which case this runner has fallen back to eager (``eager_reason``) and says so once."""
        if self._backend_prepared:
            return True
        forward = self._forward_eagerly
        entries = {
            bucket: EntryInputs(
                self.shape_descriptor(bucket),
                self._traced_inputs(static.batch),
                functools.partial(forward, static.batch),
            )
            for bucket, static in self.static_buckets.items()
        }
        try:
            self.backend.prepare(self._traced_forward(), entries)
        except ModelTraceError as error:
            # A model the compiler cannot trace still runs: this phase falls back to eager, said once, plainly.
            self.eager_reason = f"the model does not trace for {self.backend_name}: {error}"
            logger.warning("%s CUDA graphs are off, every %s step runs eagerly: %s", self.phase, self.phase, error)
            self.shutdown()
            return False
        self._backend_prepared = True
        return True

    def estimate_capture_memory(self, *, refresh: bool = False) -> CaptureMemoryEstimate:
        """What capturing this runner's buckets will take from the free device memory, known before capturing them
        (``cudagraph.runner.memory_probe``: a few probe captures into a scratch pool, all freed before it returns).
        Measured once; later calls and ``capture()`` reuse it unless ``refresh``. A model that does not trace is not
        measured (``note`` says why)."""
        if self._memory_estimate is not None and not refresh:
            return self._memory_estimate
        if self.eager_reason is not None:
            return CaptureMemoryEstimate(note=self.eager_reason)
        self._ensure_buffers()
        if not self._prepare_backend():
            return CaptureMemoryEstimate(note=self.eager_reason or "the backend could not be prepared")
        started = time.perf_counter()
        probes, out_of_memory = probe_captures(self.backend, self.buckets, self._prepare_capture)
        seconds = time.perf_counter() - started
        self._memory_estimate = estimate_from_probes(self.buckets, probes, out_of_memory=out_of_memory, seconds=seconds)
        return self._memory_estimate

    def _progress(self, buckets: list[int]) -> Iterable[int]:
        # SGLang's wording, which users grep for: "Capturing batches (bs=8 avail_mem=71.20 GiB)".
        what, key = ("batches", "bs") if self.phase is Phase.DECODE else ("tokens", "num_tokens")
        bar = tqdm(buckets, desc=f"Capturing {what}", unit="graph", disable=not self.show_progress, leave=False)
        for bucket in bar:
            if self.show_progress:
                free = self.backend.memory_reading(settle=False).free_bytes
                bar.set_description(f"Capturing {what} ({key}={bucket} avail_mem={free / 2**30:.2f} GiB)")
            yield bucket

    @property
    def profile_trace(self) -> Path | None:
        """Where the torch.profiler trace of the largest capture went (``profile_capture`` switch), or None."""
        return self.static_buckets.profile_trace

    @property
    def recompiles_at_replay(self) -> int:
        """Times the compiled model forward compiled again after capture (each a dynamo guard failing at replay)."""
        compile_stats = self.backend.compile_stats
        return compile_stats.recompiles_at_replay if compile_stats is not None else 0
