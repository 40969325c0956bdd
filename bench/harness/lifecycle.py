"""Lifecycle section: decode graphs across an engine's life, per preset (random bf16 weights, decode graphs only,
the default bucket schedule up to ``max_bs``).

- start-up: the engine built (weights loaded, not timed) to the first decode token of one request, graphs included,
  under the ``eager`` capture policy (every bucket captured first) and under ``lazy`` (a bucket captured by its
  first step). An untimed ``lazy`` start-up runs first, so neither timed one pays what a process does once (kernel
  compilation, library set-up) and the figures do not depend on which sections ran before.
- first-use capture: under ``lazy``, what capturing decode bucket ``replay_batch`` cost its first step
  (``ReplayMetrics.lazy_capture_seconds``), after the engine's first step (bucket 1).
- then one ``eager`` engine: its first capture of every bucket; a replayed step of ``replay_batch`` before and after
  an in-place update of every weight (nothing may be captured again); the bytes ``sleep()`` frees against the
  graphs' and KV cache's; ``wake()`` and the first replayed step after it.

- then, where sleepable memory exists (``cudagraph.backend_utils.sleep_memory``; else a skipped row says why), one
  engine built with sleep mode for each sleep level (0, 1, 2): the bytes its sleep frees against what the level gives
  back, the sleep's and the wake's seconds, the wake with the first replayed step (level 2: with an in-place load of
  the weights between) against the first capture, the host-to-device rate the weights' copy is judged by, and how
  many buckets were captured again (none, when the graphs outlive the sleep). The first replayed step after the wake
  must give the logits the same step gave before the sleep, or the run fails.

It measures; it never changes how the engine runs a step. An in-place update that captured a bucket again is a
wrong answer (the run fails): it promises the graphs stay valid.
"""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import cast

import torch

from cudagraph.backend_utils import sleep_memory_unavailable_reason
from cudagraph.config import Backend, CapturePolicy, CudaGraphConfig, resolve
from cudagraph.engine.batch import SamplingParams
from cudagraph.engine.generate import generate
from cudagraph.engine.lifecycle import SLEEP_LEVELS, free_device_bytes
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.engine.testing import synthetic_decode_batch
from cudagraph.runner import ForwardBatch

from .configs import BenchConfig, Kind
from .measure import guarded
from .rows import BenchResult, LifecycleRow, SleepRow, WrongAnswer
from .timing import mean_wall_us
from .workload import build_model_runner

SECTION = "lifecycle"

GRAPH_BACKENDS = tuple(backend.value for backend in Backend if backend is not Backend.DISABLED)
"""Decode graph backends the section can measure."""

POLICIES = tuple(policy.value for policy in CapturePolicy)
"""Capture policies whose start-up is timed (``eager``, then ``lazy``)."""

LIFECYCLE_CONFIG = BenchConfig("lifecycle", Kind.RUNNER, MappingProxyType({}))
"""Ours: an error while measuring fails the run."""

PROMPT = (1, 2, 3, 4)
"""The one request of a start-up row."""

CONTEXT_LEN = 32
"""Cached tokens of each request of a synthetic decode step."""

WEIGHT_SCALE = 1.01
"""The in-place update multiplies every weight by this."""


@dataclass(frozen=True)
class LifecycleSettings:
    """What the lifecycle section runs."""

    presets: tuple[str, ...]
    backend: str = "full"
    """The decode graph backend (one of ``GRAPH_BACKENDS``)."""
    max_bs: int = 256
    """The largest decode bucket: the default schedule up to it is captured."""
    attention_backend: str = "auto"
    kernel_backend: str = "auto"
    replay_batch: int = 8
    """The bucket captured on first use, and the batch of the replay and wake rows."""
    replay_steps: int = 200
    """Back-to-back replayed steps a replay row averages (after 10 untimed ones)."""

    def __post_init__(self) -> None:
        if self.backend not in GRAPH_BACKENDS:
            raise ValueError(f"lifecycle backend {self.backend!r} is not one of {', '.join(GRAPH_BACKENDS)}")
        if not 1 < self.replay_batch <= self.max_bs:
            raise ValueError(
                f"replay_batch {self.replay_batch} must be above 1 (the engine's first step is bucket 1) and at most "
                f"max_bs {self.max_bs}"
            )
        if self.replay_steps < 1:
            raise ValueError(f"replay_steps must be a positive integer, got {self.replay_steps}")

    def graph_config(self, policy: str) -> CudaGraphConfig:
        """Decode graphs of ``backend`` up to ``max_bs`` under capture ``policy``; prefill eager."""
        return resolve(
            decode_cuda_graph_backend=self.backend,
            decode_cuda_graph_max_bs=self.max_bs,
            decode_cuda_graph_capture_policy=policy,
            prefill_disable_cuda_graph=True,
        )

    def cache(self, extra_requests: int = 0) -> CacheConfig:
        """KV cache for ``max_bs`` requests (and ``extra_requests`` more) of a short context."""
        return CacheConfig(max_num_reqs=self.max_bs + extra_requests, max_context_len=256)


def run_lifecycle(result: BenchResult, settings: LifecycleSettings) -> None:
    """Measure every preset of ``settings`` and add its row (an error is a ``WrongAnswer`` of that preset)."""
    for preset in settings.presets:
        with guarded(result, SECTION, f"{preset} {settings.backend}", LIFECYCLE_CONFIG):
            row = measure_preset(preset, settings)
            result.lifecycle.append(row)
            print(f"  {preset} {settings.backend}: {describe(row)}", flush=True)
            if row.recaptured:
                result.wrong.append(
                    WrongAnswer(
                        SECTION,
                        f"{preset} {settings.backend} in-place update",
                        f"decode buckets {row.recaptured} were captured again; an in-place update keeps every graph",
                    )
                )
        reason = sleep_memory_unavailable_reason(torch.device("cuda"))
        if reason is not None:
            result.skip(SECTION, f"{preset} {settings.backend} sleep mode", reason)
            continue
        for level in SLEEP_LEVELS:
            with guarded(result, SECTION, f"{preset} {settings.backend} sleep level {level}", LIFECYCLE_CONFIG):
                sleep_row, same_logits = measure_sleep_level(preset, settings, level)
                result.sleep.append(sleep_row)
                print(f"  {preset} {settings.backend} sleep level {level}: {describe_sleep(sleep_row)}", flush=True)
                if not same_logits:
                    result.wrong.append(
                        WrongAnswer(
                            SECTION,
                            f"{preset} {settings.backend} sleep level {level}",
                            "the first step after the wake gave other logits than the same step before the sleep",
                        )
                    )


def describe(row: LifecycleRow) -> str:
    """One line of a row's figures, as it lands."""
    return (
        f"start-up eager {row.startup_s.get('eager', float('nan')):.2f} s, lazy "
        f"{row.startup_s.get('lazy', float('nan')):.2f} s; first-use capture {row.first_use_capture_ms:.1f} ms; "
        f"sleep freed {row.sleep_freed_bytes / 2**20:.0f} of {row.graph_and_kv_bytes / 2**20:.0f} MiB; wake with "
        f"the first replay {row.wake_and_first_replay_s:.2f} s; replay {row.replay_us_before:.1f} -> "
        f"{row.replay_us_after_update:.1f} us after the update"
    )


def describe_sleep(row: SleepRow) -> str:
    """One line of a sleep row's figures, as it lands."""
    return (
        f"sleep {row.sleep_s * 1000:.1f} ms, wake {row.wake_s * 1000:.1f} ms, with the first replay "
        f"{row.wake_and_first_replay_s * 1000:.1f} ms against a first capture of {row.first_capture_s:.2f} s; freed "
        f"{row.freed_bytes / 2**20:.0f} of {row.given_bytes / 2**20:.0f} MiB; captured again: {row.captured_again}"
    )


@contextmanager
def _engine(
    preset: str, settings: LifecycleSettings, policy: str, extra_requests: int, *, sleep_mode: bool = False
) -> Iterator[ModelRunner]:
    """A fresh engine (its own weights), shut down on leaving. The engines before it are collected and their blocks
    given back first: a reading of free memory in this one must not find theirs coming back during capture."""
    gc.collect()
    torch.cuda.empty_cache()
    engine = build_model_runner(
        preset,
        settings.cache(extra_requests),
        settings.attention_backend,
        kernel_backend=settings.kernel_backend,
        cuda_graph_config=settings.graph_config(policy),
        enable_sleep_mode=sleep_mode,
    )
    torch.cuda.synchronize()
    try:
        yield engine
    finally:
        engine.shutdown()


def _first_token_seconds(preset: str, settings: LifecycleSettings, policy: str) -> float:
    """The engine built to the first decode token of one request, graphs included."""
    with _engine(preset, settings, policy, extra_requests=0) as engine:
        started = time.perf_counter()
        engine.init_decode_cuda_graph()
        generate(engine, [list(PROMPT)], SamplingParams(max_new_tokens=2))
        torch.cuda.synchronize()
        return time.perf_counter() - started


def _first_use_capture_ms(preset: str, settings: LifecycleSettings) -> float:
    """Under ``lazy``: what the first step of bucket ``replay_batch`` spent capturing it, after the first step."""
    with _engine(preset, settings, "lazy", extra_requests=settings.replay_batch) as engine:
        runner = engine.init_decode_cuda_graph()
        assert runner is not None, "decode graphs are on in the section's own config"
        engine.run(synthetic_decode_batch(engine, 1, CONTEXT_LEN, seed=0))  # the engine's first step (bucket 1)
        spent = runner.metrics.lazy_capture_seconds
        engine.run(synthetic_decode_batch(engine, settings.replay_batch, CONTEXT_LEN, seed=1))
        return 1000 * (runner.metrics.lazy_capture_seconds - spent)


def _replay_us(engine: ModelRunner, batch: ForwardBatch, steps: int) -> float:
    """Mean wall time of ``steps`` back-to-back steps of ``batch`` (after 10 untimed ones)."""
    return mean_wall_us(functools.partial(engine.run, batch), steps)


def measure_preset(preset: str, settings: LifecycleSettings) -> LifecycleRow:
    """Every figure of one preset (see the module docstring)."""
    _first_token_seconds(preset, settings, "lazy")  # untimed: what the process does once
    startup = {policy: _first_token_seconds(preset, settings, policy) for policy in POLICIES}
    first_use_ms = _first_use_capture_ms(preset, settings)
    batch_size = settings.replay_batch
    with _engine(preset, settings, "eager", extra_requests=batch_size) as engine:
        before = free_device_bytes(engine.device)
        runner = engine.init_decode_cuda_graph()
        assert runner is not None and before is not None, "decode graphs on a CUDA engine"
        first_capture_s = runner.stats.seconds
        buckets = len(runner.buckets)
        batch = synthetic_decode_batch(engine, batch_size, CONTEXT_LEN, seed=2)
        replay_before = _replay_us(engine, batch, settings.replay_steps)
        after = free_device_bytes(engine.device)
        assert after is not None
        kv = sum(pages.numel() * pages.element_size() for pages in engine.token_to_kv_pool.kv_pages)
        graph_and_kv = before[0] - after[0] + kv
        with torch.no_grad():
            model = cast(torch.nn.Module, engine.model)  # the preset's random model, built by the harness
            weights = {name: param.detach() * WEIGHT_SCALE for name, param in model.named_parameters()}
        update = engine.update_weights(weights)
        del weights
        replay_after = _replay_us(engine, batch, settings.replay_steps)
        levels = engine.sleep()
        started = time.perf_counter()
        engine.wake()
        torch.cuda.synchronize()
        wake_s = time.perf_counter() - started
        engine.run(synthetic_decode_batch(engine, batch_size, CONTEXT_LEN, seed=3))
        torch.cuda.synchronize()
        wake_and_replay_s = time.perf_counter() - started
    return LifecycleRow(
        preset=preset,
        backend=settings.backend,
        buckets=buckets,
        startup_s=startup,
        first_use_capture_ms=first_use_ms,
        first_capture_s=first_capture_s,
        graph_and_kv_bytes=graph_and_kv,
        sleep_freed_bytes=levels.freed_by_sleep or 0,
        wake_s=wake_s,
        wake_and_first_replay_s=wake_and_replay_s,
        replay_us_before=replay_before,
        replay_us_after_update=replay_after,
        recaptured=list(update.recaptured.get("decode", ())),
    )


def _host_to_device_bytes_per_s(nbytes: int = 1 << 30) -> float:
    """The rate of one copy of ``nbytes`` from pinned host memory to the device (after one untimed copy)."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    started = time.perf_counter()
    device.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return nbytes / (time.perf_counter() - started)


def _graph_ids(engine: ModelRunner) -> dict[object, int]:
    """The identity of every graph entry of the engine's decode runner, by its key."""
    runner = engine.decode_cuda_graph_runner
    assert runner is not None
    return {key: id(entry) for key, entry in runner.backend.entries.items()}


def measure_sleep_level(preset: str, settings: LifecycleSettings, level: int) -> tuple[SleepRow, bool]:
    """One sleep and wake at ``level`` of an engine built with sleep mode; returns its row and whether the first
    step after the wake gave the logits the same step gave before the sleep."""
    batch_size = settings.replay_batch
    with _engine(preset, settings, "eager", extra_requests=batch_size, sleep_mode=True) as engine:
        assert engine.sleep_memory is not None, engine.sleep_memory_reason
        before = free_device_bytes(engine.device)
        runner = engine.init_decode_cuda_graph()
        assert runner is not None and before is not None, "decode graphs on a CUDA engine"
        batch = synthetic_decode_batch(engine, batch_size, CONTEXT_LEN, seed=2)
        engine.run(batch)
        expected = engine.run(batch).float().clone()
        after = free_device_bytes(engine.device)
        assert after is not None
        kv = sum(pages.numel() * pages.element_size() for pages in engine.token_to_kv_pool.kv_pages)
        model = cast(torch.nn.Module, engine.model)
        weight_bytes = sum(param.numel() * param.element_size() for param in model.parameters())
        given = before[0] - after[0] + kv + (weight_bytes if level else 0)
        host_weights = (
            {name: param.detach().to("cpu") for name, param in model.named_parameters()} if level == 2 else {}
        )
        graphs = _graph_ids(engine)
        h2d = _host_to_device_bytes_per_s()
        torch.cuda.synchronize()
        started = time.perf_counter()
        levels = engine.sleep(level)
        sleep_s = time.perf_counter() - started
        started = time.perf_counter()
        engine.wake()
        torch.cuda.synchronize()
        wake_s = time.perf_counter() - started
        if level == 2:
            engine.update_weights(host_weights)
        after_wake = engine.run(batch).float()
        torch.cuda.synchronize()
        wake_and_replay_s = time.perf_counter() - started
        now = _graph_ids(engine)
        captured_again = sum(1 for key, graph in graphs.items() if now.get(key) != graph)
        same = bool(torch.equal(after_wake, expected))
        return (
            SleepRow(
                preset=preset,
                backend=settings.backend,
                level=level,
                buckets=len(runner.buckets),
                first_capture_s=runner.stats.seconds,
                given_bytes=given,
                freed_bytes=levels.freed_by_sleep or 0,
                weight_bytes=weight_bytes,
                h2d_bytes_per_s=h2d,
                sleep_s=sleep_s,
                wake_s=wake_s,
                wake_and_first_replay_s=wake_and_replay_s,
                captured_again=captured_again,
            ),
            same,
        )
