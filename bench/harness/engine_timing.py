"""Decode-step timing of the reference engine: eager, a raw ``CUDAGraph.replay`` of the same forward, and the graph
runners.

Used by ``bench/bench_engine.py`` and the harness. Every mode runs the same ``ForwardBatch`` (a
decode step over requests with ``context_len`` cached tokens), so the ratios compare like with like.

Host cost (``measure_host_costs``) is the time the step call takes on the host while the device is kept busy by a
sleep kernel queued first, so nothing the call launches can wait for the device or be hidden by it: the runner's
work over a raw replay is ``full - raw``, and the cost of one eager break is ``(breakable - full) / breaks``.
``profile_host`` runs a replay loop under cProfile and returns its top entries; ``runner_replay_timeline`` records
what the device runs during a replay loop and where it idles (``timeline``).
"""

from __future__ import annotations

import contextlib
import cProfile
import functools
import io
import pstats
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from cudagraph.backend_utils import graph_replay_fn, model_capture_mode
from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
from cudagraph.engine.model_runner import ModelRunner
from cudagraph.engine.testing import release_synthetic_batch, synthetic_decode_batch
from cudagraph.runner import CaptureStats, DecodeCudaGraphRunner, ForwardBatch, ForwardMode

from .timeline import StepTimeline, record_timeline, sleep_cycles_per_ms


@dataclass(frozen=True)
class StepTiming:
    """One mode at one batch size."""

    mode: str
    batch_size: int
    step_ms: float
    """Mean time per step over back-to-back steps (the host may run ahead of the device)."""
    latency_ms: float
    """Median time of one step from launch to device idle."""
    host_us: float
    """Median host time of the step call alone, launched onto an idle device."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


@dataclass(frozen=True)
class CaptureTiming:
    """What capturing a set of decode buckets cost."""

    backend: str
    buckets: list[int]
    num_warmups: int
    seconds: float
    bytes: int

    @classmethod
    def of(cls, backend: str, buckets: list[int], num_warmups: int, stats: CaptureStats) -> CaptureTiming:
        """From a runner's capture stats."""
        return cls(backend, buckets, num_warmups, stats.seconds, stats.bytes)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)


def decode_only_config(
    backend: Backend, buckets: list[int], settings: CudaGraphConfig | None = None
) -> CudaGraphConfig:
    """A config that graphs decode with ``backend`` at exactly ``buckets`` and leaves prefill eager; the other
    settings (tc_piecewise compiler, compiled small buckets, debug...) are ``settings``' (default: the defaults)."""
    decode = PhaseConfig(backend, tuple(sorted(buckets)), max(buckets))
    disabled = PhaseConfig(Backend.DISABLED, (), 0)
    if settings is None:
        return CudaGraphConfig(decode=decode, prefill=disabled)
    return replace(settings, decode=decode, prefill=disabled)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_step(
    mode: str, batch_size: int, step: Callable[[], object], device: torch.device, steps: int = 50, warmup: int = 5
) -> StepTiming:
    """Time ``step``: back-to-back mean, synchronized median, and host time of the call on an idle device."""
    for _ in range(warmup):
        step()
    _synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    _synchronize(device)
    back_to_back = (time.perf_counter() - started) / steps
    host, latency = [], []
    for _ in range(steps):
        launched = time.perf_counter()
        step()
        returned = time.perf_counter()
        _synchronize(device)
        host.append(returned - launched)
        latency.append(time.perf_counter() - launched)
    return StepTiming(
        mode, batch_size, back_to_back * 1e3, statistics.median(latency) * 1e3, statistics.median(host) * 1e6
    )


def capture_raw_graph(model_runner: ModelRunner, batch: ForwardBatch) -> torch.cuda.CUDAGraph:
    """One ``torch.cuda.CUDAGraph`` of ``model_runner.forward(batch)`` on ``batch``'s own tensors: the floor a runner
    is measured against (no copies, no padding, no hooks at replay)."""
    return capture_raw_graph_and_output(model_runner, batch)[0]


def capture_raw_graph_and_output(
    model_runner: ModelRunner, batch: ForwardBatch
) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """``capture_raw_graph`` and the captured forward's logits, which every replay rewrites."""
    attn_backend = model_runner.attn_backend
    attn_backend.init_cuda_graph_state(batch.batch_size, batch.batch_size)
    graph = torch.cuda.CUDAGraph()
    with model_capture_mode():
        attn_backend.init_forward_metadata_capture_cuda_graph(
            batch.batch_size, batch.batch_size, batch.req_pool_indices, batch.seq_lens, ForwardMode.DECODE
        )
        stream = torch.cuda.Stream(model_runner.device)
        stream.wait_stream(torch.cuda.current_stream(model_runner.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                model_runner.forward(batch)
        torch.cuda.current_stream(model_runner.device).wait_stream(stream)
        with torch.cuda.graph(graph):
            logits = model_runner.forward(batch)
    return graph, logits


def _step_of(
    mode: str, model_runner: ModelRunner, batch: ForwardBatch, runners: dict[str, DecodeCudaGraphRunner]
) -> Callable[[], object]:
    """One decode step of ``batch`` the way ``mode`` runs it."""
    if mode == "eager":
        return lambda: model_runner.forward(batch)
    if mode == "raw":
        return graph_replay_fn(capture_raw_graph(model_runner, batch))
    runner = runners[mode]
    return lambda: runner.replay(batch)


@dataclass(frozen=True)
class DecodeBench:
    """Step timings of every mode and batch size, and what capturing each graphed mode cost (this rank's)."""

    timings: list[StepTiming]
    captures: list[CaptureTiming]
    graphs_off: dict[str, str] = field(default_factory=dict)
    """Graphed modes whose runner captured nothing (every step would run eagerly), each with the runner's reason:
    they are not timed, so no eager step is reported under a graph backend's name."""


def bench_decode(
    model_runner: ModelRunner,
    batch_sizes: list[int],
    modes: list[str],
    *,
    context_len: int = 128,
    steps: int = 50,
) -> list[StepTiming]:
    """Time every mode in ``modes`` (``eager``, ``raw``, ``full``, ``breakable``, ``tc_piecewise``) at every batch
    size; ``tc_piecewise`` compiles with the model runner's configured compiler."""
    return run_decode_bench(model_runner, batch_sizes, modes, context_len=context_len, steps=steps).timings


def run_decode_bench(
    model_runner: ModelRunner,
    batch_sizes: list[int],
    modes: list[str],
    *,
    context_len: int = 128,
    steps: int = 50,
) -> DecodeBench:
    """``bench_decode`` plus the capture cost of each graphed mode. On a tensor-parallel rank every rank must call
    it with the same arguments: the ranks capture and step in lock-step (the batches are seeded, not random)."""
    too_many = [size for size in batch_sizes if size > model_runner.req_to_token_pool.max_num_reqs]
    if too_many:
        raise ValueError(
            f"batch sizes {too_many} exceed the KV cache's {model_runner.req_to_token_pool.max_num_reqs} request rows: "
            "raise --max-num-reqs or drop them"
        )
    settings = model_runner.cuda_graph_config
    runners: dict[str, DecodeCudaGraphRunner] = {}
    captures: list[CaptureTiming] = []
    graphs_off: dict[str, str] = {}
    for mode in modes:
        if mode in ("full", "breakable", "tc_piecewise"):
            runner = DecodeCudaGraphRunner(
                model_runner,
                decode_only_config(Backend(mode), batch_sizes, settings),
                show_progress=False,
                capture_barrier=model_runner.capture_barrier,
            )
            stats = runner.capture()
            runners[mode] = runner
            captures.append(CaptureTiming.of(mode, list(runner.buckets), runner.backend.options.num_warmups, stats))
            if not runner.captured_buckets:
                graphs_off[mode] = runner.eager_reason or "no bucket was captured"
    results = []
    for batch_size in batch_sizes:
        batch = synthetic_decode_batch(model_runner, batch_size, context_len, seed=batch_size)
        for mode in modes:
            if mode in graphs_off:
                continue
            step = _step_of(mode, model_runner, batch, runners)
            results.append(time_step(mode, batch_size, step, model_runner.device, steps=steps))
        release_synthetic_batch(model_runner, batch, context_len)
    for runner in runners.values():
        runner.shutdown()
    return DecodeBench(results, captures, graphs_off)


def bench_capture(
    model_runner: ModelRunner, backend: Backend, buckets: list[int], num_warmups: int = 2
) -> CaptureTiming:
    """Capture ``buckets`` with ``backend`` once, measure it, free it."""
    config = decode_only_config(backend, buckets)
    runner = DecodeCudaGraphRunner(model_runner, config, show_progress=False, num_warmups=num_warmups)
    stats = runner.capture()
    timing = CaptureTiming.of(str(backend), list(runner.buckets), num_warmups, stats)
    runner.shutdown()
    return timing


def format_table(timings: list[StepTiming]) -> str:
    """A plain-text table, one row per batch size, one column group per mode, with ratios to ``raw`` or eager."""
    modes = list(dict.fromkeys(t.mode for t in timings))
    by_key = {(t.mode, t.batch_size): t for t in timings}
    reference = "raw" if "raw" in modes else modes[0]
    header = (
        ["batch"] + [f"{mode} ms" for mode in modes] + [f"{mode}/{reference}" for mode in modes if mode != reference]
    )
    header += [f"{mode} host us" for mode in modes]
    lines = [" | ".join(header)]
    for batch_size in sorted({t.batch_size for t in timings}):
        row = [str(batch_size)]
        row += [f"{by_key[(mode, batch_size)].step_ms:.3f}" for mode in modes]
        base = by_key[(reference, batch_size)].step_ms
        row += [f"{by_key[(mode, batch_size)].step_ms / base:.3f}x" for mode in modes if mode != reference]
        row += [f"{by_key[(mode, batch_size)].host_us:.1f}" for mode in modes]
        lines.append(" | ".join(row))
    return "\n".join(lines)


@dataclass(frozen=True)
class HostCost:
    """Host microseconds of one decode step at one batch size: a raw replay, the runner's full and breakable
    replays, and what follows from them."""

    batch_size: int
    raw_us: float
    full_us: float
    full_in_place_us: float
    """The full runner replaying a batch written into its input views (``input_views``): no input copy."""
    breakable_us: float
    breaks: int
    """Eager breaks of the breakable graph the batch replays (one per attention layer)."""
    device_waited: bool
    """True when a step's host time reached the device's head start: the call waited for the device (a host sync or
    a pageable copy), so the figures above include device time and say little about host work."""

    @property
    def runner_over_raw_us(self) -> float:
        """Host work the full runner adds to a raw ``CUDAGraph`` replay (copies, metadata hook, bookkeeping)."""
        return self.full_us - self.raw_us

    @property
    def in_place_over_raw_us(self) -> float:
        """Host work the full runner adds to a raw replay when the batch is already in its input views."""
        return self.full_in_place_us - self.raw_us

    @property
    def per_break_us(self) -> float:
        """Host cost of one eager break: ``(breakable - full) / breaks``."""
        return (self.breakable_us - self.full_us) / self.breaks if self.breaks else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields, the derived ones included."""
        return {
            **asdict(self),
            "runner_over_raw_us": self.runner_over_raw_us,
            "in_place_over_raw_us": self.in_place_over_raw_us,
            "per_break_us": self.per_break_us,
        }


def host_time_us(
    step: Callable[[], object], device: torch.device, *, repeats: int = 50, head_start_ms: float = 20.0
) -> tuple[float, bool]:
    """Median host microseconds of ``step()`` called while the device still has ``head_start_ms`` of sleep queued,
    and whether any call took that long (it then waited for the device)."""
    cycles = int(sleep_cycles_per_ms(device) * head_start_ms)
    for _ in range(3):
        step()
    torch.cuda.synchronize(device)
    samples, waited = [], False
    for _ in range(repeats):
        torch.cuda._sleep(cycles)
        started = time.perf_counter()
        step()
        elapsed = time.perf_counter() - started
        torch.cuda.synchronize(device)
        samples.append(elapsed)
        waited = waited or elapsed * 1e3 >= 0.9 * head_start_ms
    return statistics.median(samples) * 1e6, waited


def batch_in_views(runner: DecodeCudaGraphRunner, batch: ForwardBatch) -> ForwardBatch:
    """``batch`` written into ``runner``'s input views (what an engine building its step in place hands over)."""
    views = runner.input_views(batch.batch_size)
    if views is None:
        raise ValueError(f"{runner!r} replays no graph at batch size {batch.batch_size}: it has no input views")
    for name, view in views.items():
        source = getattr(batch, name)
        if source is not None:
            view.copy_(source)
    return replace(batch, **views)


def measure_host_costs(
    model_runner: ModelRunner, batch_sizes: list[int], *, context_len: int = 128, repeats: int = 50
) -> list[HostCost]:
    """``HostCost`` at every batch size: raw replay, full runner and breakable runner, each timed by ``host_time_us``
    on the same batch (the runners capture exactly ``batch_sizes``)."""
    if model_runner.device.type != "cuda":
        raise ValueError(f"host costs are measured around CUDA graph replays; the model runs on {model_runner.device}")
    runners = {
        mode: DecodeCudaGraphRunner(model_runner, decode_only_config(Backend(mode), batch_sizes), show_progress=False)
        for mode in ("full", "breakable")
    }
    costs = []
    try:
        for runner in runners.values():
            runner.capture()
        for batch_size in batch_sizes:
            batch = synthetic_decode_batch(model_runner, batch_size, context_len, seed=batch_size)
            raw_us, raw_waited = host_time_us(
                _step_of("raw", model_runner, batch, {}), model_runner.device, repeats=repeats
            )
            full_us, full_waited = host_time_us(
                _step_of("full", model_runner, batch, runners), model_runner.device, repeats=repeats
            )
            in_place = batch_in_views(runners["full"], batch)
            in_place_us, in_place_waited = host_time_us(
                functools.partial(runners["full"].replay, in_place), model_runner.device, repeats=repeats
            )
            breakable = runners["breakable"]
            breakable_us, breakable_waited = host_time_us(
                _step_of("breakable", model_runner, batch, runners), model_runner.device, repeats=repeats
            )
            bucket = breakable.pad_to_bucket(batch_size)
            breaks = breakable.backend.entry(bucket).graph.num_eager_calls if bucket is not None else 0
            waited = raw_waited or full_waited or in_place_waited or breakable_waited
            costs.append(HostCost(batch_size, raw_us, full_us, in_place_us, breakable_us, breaks, waited))
            release_synthetic_batch(model_runner, batch, context_len)
    finally:
        for runner in runners.values():
            runner.shutdown()
    return costs


def format_host_costs(costs: list[HostCost]) -> str:
    """A plain-text table of ``HostCost`` rows."""
    lines = [
        "batch | raw host us | full host us | full in place host us | breakable host us | breaks | runner over raw us "
        "| in place over raw us | us per break"
    ]
    for cost in costs:
        flag = "  (waited on the device)" if cost.device_waited else ""
        lines.append(
            f"{cost.batch_size} | {cost.raw_us:.1f} | {cost.full_us:.1f} | {cost.full_in_place_us:.1f} | "
            f"{cost.breakable_us:.1f} | {cost.breaks} | {cost.runner_over_raw_us:.1f} | "
            f"{cost.in_place_over_raw_us:.1f} | {cost.per_break_us:.2f}{flag}"
        )
    return "\n".join(lines)


def profile_host(step: Callable[[], object], device: torch.device, *, steps: int = 200, top: int = 25) -> str:
    """Run ``step`` ``steps`` times under cProfile (warmed up first; the device synchronized every 20 steps so its
    queue never fills) and return the ``top`` entries by own time, as pstats prints them."""
    for _ in range(5):
        step()
    _synchronize(device)
    profiler = cProfile.Profile()
    profiler.enable()
    for index in range(steps):
        step()
        if index % 20 == 19:
            _synchronize(device)
    profiler.disable()
    _synchronize(device)
    report = io.StringIO()
    pstats.Stats(profiler, stream=report).sort_stats("tottime").print_stats(top)
    return report.getvalue()


@contextlib.contextmanager
def replay_step(
    model_runner: ModelRunner,
    mode: str,
    batch_size: int,
    *,
    context_len: int = 128,
    settings: CudaGraphConfig | None = None,
) -> Iterator[Callable[[], object]]:
    """One decode step of ``mode`` (``eager``, ``raw``, ``full``, ``breakable``, ``tc_piecewise``) over a synthetic
    batch of ``batch_size`` requests, its runner captured for that size alone; the batch and runner are released
    when the block ends. ``settings`` carries the rest of the runner's config (the tc_piecewise compiler...)."""
    runners: dict[str, DecodeCudaGraphRunner] = {}
    if mode not in ("eager", "raw"):
        runners[mode] = DecodeCudaGraphRunner(
            model_runner, decode_only_config(Backend(mode), [batch_size], settings), show_progress=False
        )
        runners[mode].capture()
    batch = synthetic_decode_batch(model_runner, batch_size, context_len, seed=batch_size)
    try:
        yield _step_of(mode, model_runner, batch, runners)
    finally:
        release_synthetic_batch(model_runner, batch, context_len)
        for runner in runners.values():
            runner.shutdown()


def profile_runner_replay(
    model_runner: ModelRunner,
    mode: str,
    batch_size: int,
    *,
    context_len: int = 128,
    steps: int = 200,
    top: int = 25,
    settings: CudaGraphConfig | None = None,
) -> str:
    """``profile_host`` of ``mode``'s decode replay (see ``replay_step``)."""
    with replay_step(model_runner, mode, batch_size, context_len=context_len, settings=settings) as step:
        return profile_host(step, model_runner.device, steps=steps, top=top)


def runner_replay_timeline(
    model_runner: ModelRunner, mode: str, batch_size: int, *, context_len: int = 128, steps: int = 5
) -> StepTimeline:
    """``record_timeline`` of ``mode``'s decode replay (see ``replay_step``): what the device runs and where it
    idles over ``steps`` back-to-back steps."""
    with replay_step(model_runner, mode, batch_size, context_len=context_len) as step:
        return record_timeline(step, model_runner.device, steps=steps)
