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

from cudagraph.config import Backend, CapturePolicy, CudaGraphConfig, resolve
from cudagraph.engine.batch import SamplingParams
from cudagraph.engine.generate import generate
from cudagraph.engine.lifecycle import free_device_bytes
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.engine.testing import synthetic_decode_batch
from cudagraph.runner import ForwardBatch

from .configs import BenchConfig, Kind
from .measure import guarded
from .rows import BenchResult, LifecycleRow, WrongAnswer
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


def describe(row: LifecycleRow) -> str:
    """One line of a row's figures, as it lands."""
    return (
        f"start-up eager {row.startup_s.get('eager', float('nan')):.2f} s, lazy "
        f"{row.startup_s.get('lazy', float('nan')):.2f} s; first-use capture {row.first_use_capture_ms:.1f} ms; "
        f"sleep freed {row.sleep_freed_bytes / 2**20:.0f} of {row.graph_and_kv_bytes / 2**20:.0f} MiB; wake with "
        f"the first replay {row.wake_and_first_replay_s:.2f} s; replay {row.replay_us_before:.1f} -> "
        f"{row.replay_us_after_update:.1f} us after the update"
    )


@contextmanager
def _engine(preset: str, settings: LifecycleSettings, policy: str, extra_requests: int) -> Iterator[ModelRunner]:
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
