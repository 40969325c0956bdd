"""Tensor-parallel section: decode steps at TP = 1, 2, 4, ... (the sizes the machine's GPUs hold and the model's
heads divide), each size in rank processes this section starts itself (``cudagraph.engine.distributed.launch``, as
the engine's ``--tp-size`` does).

One launch per preset and size; in it every rank:

1. Start-up: builds the engine with the default graphs (decode ``full``, prefill ``breakable``, default buckets)
   and runs one prompt to its first token. Rank 0 reports the seconds from the launch to that token; every rank
   its graph bytes per phase (``TensorParallelStartRow``).
2. Steps: each backend in turn (eager first: its greedy tokens are the reference) captures the measured batch sizes,
   checks its tokens against eager's and is timed on rank 0; its capture seconds and every rank's graph bytes are
   recorded (``TensorParallelRow``). The ranks step in lock-step, so rank 0's time is the group's.
3. All-reduce share: torch.profiler on rank 0 over ``full`` replays (all-reduce kernels' device time over every
   kernel's).
4. Each other all-reduce path asked for (``process-group`` where ``auto`` chose symmetric memory): ``raw`` and
   ``full`` again, on that path.

A decision that could differ between ranks (a backend that failed to capture on one of them) is shared before it
is acted on, so no rank waits in a collective another rank skipped. It measures; it never changes the engine.
"""

from __future__ import annotations

import gc
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from cudagraph.backend_utils import graph_replay_fn
from cudagraph.config import Backend, resolve
from cudagraph.engine.batch import SamplingParams
from cudagraph.engine.distributed import (
    GroupOptions,
    RankFailedError,
    TensorParallelGroup,
    init_tensor_parallel,
    launch,
    shutdown_tensor_parallel,
)
from cudagraph.engine.generate import generate
from cudagraph.engine.model import SINGLE_RANK, CausalLM, ModelConfig, ShardPlan, TensorParallelError, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.engine.testing import release_synthetic_batch, synthetic_decode_batch
from cudagraph.runner import DecodeCudaGraphRunner, ForwardBatch

from .engine_timing import capture_raw_graph_and_output, decode_only_config, time_step
from .presets import preset_config
from .profiles import Iterations
from .rows import BenchResult, TensorParallelRow, TensorParallelStartRow, WrongAnswer, with_tensor_parallel_ratios
from .workload import check_tokens

SECTION = "tp"

BACKENDS = ("eager", "raw", "full", "breakable", "tc_piecewise")
"""Every configuration a size measures, in measurement order (eager first: the reference tokens)."""

GRAPHED = frozenset({"full", "breakable", "tc_piecewise"})
"""Configurations captured by a graph runner (the others are eager and one raw ``CUDAGraph``)."""

ALL_REDUCE_KERNEL_WORDS = ("allreduce", "all_reduce", "one_shot")
"""A kernel whose lower-cased name holds one of these is all-reduce time (NCCL's ``ncclDevKernel_AllReduce...``,
symmetric memory's ``one_shot_all_reduce_kernel``)."""

FIRST_TOKEN_PROMPT = (1, 2, 3, 4, 5, 6, 7, 8)
"""The prompt start-up runs to its first token."""


@dataclass(frozen=True)
class TensorParallelSettings:
    """What the section runs: per preset the sizes to try, the decode batch sizes, the backends and the all-reduce
    paths (the first, ``auto`` by default, for every backend; each other for ``raw`` and ``full``)."""

    presets: tuple[tuple[str, tuple[int, ...]], ...]
    batch_sizes: tuple[int, ...]
    context_len: int
    iterations: Iterations
    attention_backend: str = "triton"
    kernel_backend: str = "auto"
    backends: tuple[str, ...] = BACKENDS
    all_reduce_paths: tuple[str, ...] = ("auto", "process-group")
    profile_steps: int = 10
    timeout_s: float = 180.0


@dataclass(frozen=True)
class RankJob:
    """What every rank of one launch is handed (pickled to the spawned processes)."""

    preset: str
    settings: TensorParallelSettings
    launched_at: float
    """``time.time()`` in the parent just before the launch (wall clock: comparable across processes)."""


@dataclass
class RankReport:
    """What rank 0 sends back: start-up, step rows (without ratios), wrong answers and skips."""

    start: TensorParallelStartRow | None = None
    rows: list[TensorParallelRow] = field(default_factory=list)
    wrong: list[WrongAnswer] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def usable_sizes(config: ModelConfig, sizes: tuple[int, ...], devices: int) -> tuple[list[int], dict[int, str]]:
    """The sizes of ``sizes`` this machine and ``config`` can run, and why each other one cannot."""
    usable, refused = [], {}
    for size in sizes:
        if size > devices:
            refused[size] = f"needs {size} GPUs, {devices} visible"
            continue
        try:
            ShardPlan(rank=0, size=size, group_name="tp").check(config)
        except TensorParallelError as error:
            refused[size] = str(error)
            continue
        usable.append(size)
    return usable, refused


def run_tensor_parallel(result: BenchResult, settings: TensorParallelSettings) -> None:
    """Launch every usable size of every preset and add its rows (TP=1's ratios filled in at the end)."""
    devices = torch.cuda.device_count()
    rows: list[TensorParallelRow] = []
    for preset, sizes in settings.presets:
        usable, refused = usable_sizes(preset_config(preset), sizes, devices)
        for size, reason in refused.items():
            result.skip(SECTION, f"{preset} TP={size}", reason)
        for size in usable:
            print(f"  {preset} TP={size}: launching {size} rank{'s' * (size > 1)}", flush=True)
            job = RankJob(preset, settings, time.time())
            try:
                report: RankReport = launch(rank_main, job, size, exit_timeout_s=settings.timeout_s)
            except RankFailedError as error:
                result.wrong.append(WrongAnswer(SECTION, f"{preset} TP={size}", str(error)))
                continue
            if report.start is not None:
                result.tp_start.append(report.start)
            rows += report.rows
            result.wrong += report.wrong
            for what, reason in report.skipped:
                result.skip(SECTION, what, reason)
    result.tp += with_tensor_parallel_ratios(rows)


def rank_main(rank: int, world_size: int, init_method: str, job: RankJob) -> RankReport | None:
    """One rank of a launch (module-level, so ``spawn`` can import it): join the group (none at TP=1), measure,
    tear down in order; rank 0's report."""
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    group = None
    if world_size > 1:
        group = init_tensor_parallel(GroupOptions(rank, world_size, device, init_method, job.settings.timeout_s))
    try:
        report = RankBench(job, group, device).run()
    finally:
        if group is not None:
            shutdown_tensor_parallel(group)
    return report if rank == 0 else None


class RankBench:
    """The measurements of one rank (see the module docstring); every rank runs the same calls in the same order."""

    def __init__(self, job: RankJob, group: TensorParallelGroup | None, device: torch.device) -> None:
        self.job = job
        self.settings = job.settings
        self.group = group
        self.device = device
        self.rank = group.rank if group is not None else 0
        self.tp_size = group.world_size if group is not None else 1
        self.report = RankReport()

    # -- what the ranks share ---------------------------------------------------------------------------------------

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` in rank order (host side)."""
        if self.group is None:
            return [value]
        gathered: list[Any] = [None] * self.tp_size
        dist.all_gather_object(gathered, value, group=self.group.cpu_group)
        return gathered

    def all_ok(self, ok: bool) -> bool:
        """Whether ``ok`` holds on every rank: one rank's failure stops them all at the same point."""
        return all(self.gather(ok))

    # -- the run ----------------------------------------------------------------------------------------------------

    def run(self) -> RankReport:
        """Start-up, then the steps of every backend and path."""
        config = preset_config(self.job.preset)
        shard = self.group.shard_plan() if self.group is not None else SINGLE_RANK
        model = random_model(config, seed=0, dtype="bfloat16", device=self.device, shard=shard)
        defaults = resolve()
        largest_batch = max(max(self.settings.batch_sizes), defaults.decode.max_size)
        self.model_ready_at = time.time()
        self.choose_path(self.settings.all_reduce_paths[0], model.dtype, largest_batch * config.hidden_size)
        # As the engine starts a group: NCCL's buffers for every step's messages set up before any capture.
        largest_tokens = max(largest_batch, defaults.prefill.max_size)
        self.collective_bytes = self.gather(
            self.group.warm_collectives(model.dtype, largest_tokens * config.hidden_size) if self.group else 0
        )
        engine = self.engine(model, largest_batch)
        try:
            self.start_up(engine)
            self.steps(engine, self.settings.backends, self.settings.all_reduce_paths[0])
            for path in self.settings.all_reduce_paths[1:]:
                if self.group is None or not self.choose_path(path, model.dtype, largest_batch * config.hidden_size):
                    continue
                self.steps(engine, tuple(b for b in ("raw", "full") if b in self.settings.backends), path)
        finally:
            engine.shutdown()
        return self.report

    def choose_path(self, requested: str, dtype: torch.dtype, elements: int) -> bool:
        """Register the all-reduce path ``requested`` (none at TP=1); False when it repeats the current one."""
        if self.group is None:
            self.path_kind, self.symm_capacity = "none", 0
            return False
        previous = self.group.all_reduce
        choice = self.group.choose_all_reduce(requested, dtype, elements)
        if previous is not None:
            previous.communicator.close()
            if previous.kind == choice.kind:
                return False
        self.path_kind = choice.kind
        buffer = getattr(choice.communicator, "buffer", None)
        self.symm_capacity = buffer.numel() if buffer is not None else 0
        return True

    def step_path(self, batch_size: int, hidden_size: int) -> str:
        """The path a decode step's all-reduces of ``batch_size`` rows take."""
        if self.path_kind == "symm-mem" and batch_size * hidden_size > self.symm_capacity:
            return "process-group"
        return self.path_kind

    def engine(self, model: Any, largest_batch: int) -> ModelRunner:
        """The engine with the default graph config (its runners built by ``start_up``)."""
        cache = CacheConfig(max_num_reqs=largest_batch + 2, max_context_len=2 * self.settings.context_len)
        return ModelRunner(
            model,
            resolve(),
            cache_config=cache,
            attention_backend=self.settings.attention_backend,
            kernel_backend=self.settings.kernel_backend,
            capture_barrier=self.group.capture_barrier if self.group is not None else None,
        )

    def start_up(self, engine: ModelRunner) -> None:
        """Capture the default graphs, run one prompt to its first token; record the start-up row; free the graphs."""
        started = time.perf_counter()
        engine.init_cuda_graphs()
        capture_seconds = time.perf_counter() - started
        generate(engine, [list(FIRST_TOKEN_PROMPT)], SamplingParams(max_new_tokens=1))
        torch.cuda.synchronize(self.device)
        first_token_at = time.time()
        decode, prefill = engine.decode_cuda_graph_runner, engine.prefill_cuda_graph_runner
        decode_bytes = self.gather(decode.stats.bytes if decode is not None else 0)
        prefill_bytes = self.gather(prefill.stats.bytes if prefill is not None else 0)
        decode_graphs = len(decode.captured_buckets) if decode is not None else 0
        prefill_graphs = len(prefill.captured_buckets) if prefill is not None else 0
        head = engine.model.logits_gather if isinstance(engine.model, CausalLM) else None  # None at TP=1
        head_bytes = self.gather(head.nbytes if head is not None else 0)
        engine.shutdown()
        self.report.start = TensorParallelStartRow(
            preset=self.job.preset,
            tp_size=self.tp_size,
            all_reduce=self.path_kind,
            startup_seconds=first_token_at - self.job.launched_at,
            weights_seconds=self.model_ready_at - self.job.launched_at,
            capture_seconds=capture_seconds,
            decode_graphs=decode_graphs,
            decode_graph_bytes_per_rank=decode_bytes,
            prefill_graphs=prefill_graphs,
            prefill_graph_bytes_per_rank=prefill_bytes,
            collective_buffer_bytes_per_rank=self.collective_bytes,
            head_gather_bytes_per_rank=head_bytes,
        )
        gc.collect()
        torch.cuda.empty_cache()

    def steps(self, engine: ModelRunner, backends: tuple[str, ...], choice: str) -> None:
        """Every backend of ``backends`` at every batch size, on the registered all-reduce path."""
        with self.batches(engine) as batches:
            eager_logits = {size: engine.forward(batch).float().cpu() for size, batch in batches.items()}
            for backend in backends:
                what = f"{self.job.preset} TP={self.tp_size} {backend} ({choice})"
                try:
                    measured = self.measure(engine, backend, batches, eager_logits, choice)
                    error = None
                except Exception as failure:  # recorded; every rank learns of it below
                    traceback.print_exc()
                    measured, error = None, f"{type(failure).__name__}: {failure}"
                if not self.all_ok(error is None):
                    self.report.skipped.append((what, error or "failed on another rank"))
                    continue
                assert measured is not None
                self.report.rows += measured
                gc.collect()
                torch.cuda.empty_cache()

    @contextmanager
    def batches(self, engine: ModelRunner) -> Iterator[dict[int, ForwardBatch]]:
        """One seeded decode batch per batch size (the same on every rank), released at the end."""
        context_len = self.settings.context_len
        made = {
            size: synthetic_decode_batch(engine, size, context_len, seed=size) for size in self.settings.batch_sizes
        }
        try:
            yield made
        finally:
            for batch in made.values():
                release_synthetic_batch(engine, batch, context_len)

    def measure(
        self,
        engine: ModelRunner,
        backend: str,
        batches: dict[int, ForwardBatch],
        eager_logits: dict[int, torch.Tensor],
        choice: str,
    ) -> list[TensorParallelRow]:
        """Capture ``backend`` for every batch size, check and time each; the rows (rank 0's figures)."""
        sizes = sorted(batches)
        graph_bytes: list[int] | None = None
        capture_seconds: float | None = None
        runner: DecodeCudaGraphRunner | None = None
        raw_graphs: dict[int, Any] = {}
        default_kernels = engine.kernels
        if backend in GRAPHED:
            config = decode_only_config(Backend(backend), sizes, engine.cuda_graph_config)
            engine.use_kernels(engine.kernels_for(config))
            runner = DecodeCudaGraphRunner(engine, config, show_progress=False, capture_barrier=engine.capture_barrier)
            stats = runner.capture()
            graph_bytes, capture_seconds = self.gather(stats.bytes), stats.seconds
        rows = []
        hidden = engine.model.config.hidden_size
        try:
            for size in sizes:
                batch = batches[size]
                step = self.step_fn(engine, backend, batch, runner, raw_graphs)
                check = check_tokens(eager_logits[size].to(self.device), step().float())
                if not check.ok:
                    self.report.wrong.append(
                        WrongAnswer(SECTION, f"{self.job.preset} TP={self.tp_size} {backend} bs {size}", str(check))
                    )
                    continue
                iterations = self.settings.iterations
                timing = time_step(backend, size, step, self.device, steps=iterations.timed, warmup=iterations.warmup)
                share = self.all_reduce_share(step) if backend == "full" and self.tp_size > 1 else None
                rows.append(
                    TensorParallelRow(
                        preset=self.job.preset,
                        tp_size=self.tp_size,
                        backend=backend,
                        batch_size=size,
                        all_reduce_choice=choice if self.group is not None else "none",
                        all_reduce=self.step_path(size, hidden),
                        step_ms=timing.step_ms,
                        host_us=timing.host_us,
                        graph_bytes_per_rank=graph_bytes,
                        capture_seconds=capture_seconds,
                        all_reduce_share=share,
                    )
                )
                if self.rank == 0:
                    shown = "" if share is None else f", all-reduce {share:.0%} of device time"
                    print(
                        f"  {self.job.preset} TP={self.tp_size} {backend} bs {size} ({rows[-1].all_reduce}): "
                        f"{timing.step_ms:.3f} ms, host {timing.host_us:.0f} us{shown}",
                        flush=True,
                    )
        finally:
            if runner is not None:
                runner.shutdown()
            raw_graphs.clear()
            engine.use_kernels(default_kernels)
        return rows

    def step_fn(
        self,
        engine: ModelRunner,
        backend: str,
        batch: ForwardBatch,
        runner: DecodeCudaGraphRunner | None,
        raw_graphs: dict[int, Any],
    ) -> Callable[[], torch.Tensor]:
        """One decode step of ``batch`` as ``backend`` runs it (a raw graph is captured here, on every rank)."""
        if backend == "eager":
            return lambda: engine.forward(batch)
        if backend == "raw":
            graph, logits = capture_raw_graph_and_output(engine, batch)
            raw_graphs[batch.batch_size] = graph
            replay = graph_replay_fn(graph)

            def raw_step() -> torch.Tensor:
                replay()
                return logits

            return raw_step
        assert runner is not None
        return lambda: runner.replay(batch)

    def all_reduce_share(self, step: Callable[[], object]) -> float | None:
        """All-reduce kernels' share of the device time of ``profile_steps`` steps (rank 0 profiles; the other
        ranks run the same steps unprofiled, as the collectives need)."""
        steps = self.settings.profile_steps
        if self.rank != 0:
            for _ in range(steps):
                step()
            torch.cuda.synchronize(self.device)
            return None
        activities = [torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as profiler:
            for _ in range(steps):
                step()
            torch.cuda.synchronize(self.device)
        return kernel_share(
            ((event.key, event.self_device_time_total) for event in profiler.key_averages()), ALL_REDUCE_KERNEL_WORDS
        )


def kernel_share(kernels: Iterable[tuple[str, float]], words: tuple[str, ...]) -> float | None:
    """The share of the device time of ``kernels`` (name, time) spent in those whose lower-cased name holds one of
    ``words``; None when no time was recorded."""
    total = matched = 0.0
    for name, device_time in kernels:
        total += device_time
        if any(word in name.lower() for word in words):
            matched += device_time
    return matched / total if total > 0 else None
