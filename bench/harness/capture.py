"""Capture section: for each runner backend, capture the phase's default buckets (graphs, seconds, device bytes),
shut down, estimate the graph memory and capture again (the repeat: seconds, and the bytes the estimate predicted);
and ``tc_piecewise`` compile seconds in a fresh process with empty compile caches (cold) and again with the caches
the first left behind (warm)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from cudagraph.engine.model_runner import CacheConfig

from .configs import CAPTURE_BACKENDS, BenchConfig, default_shapes
from .make_source import make_source
from .measure import guarded
from .models import ModelCache
from .rows import BenchResult, CaptureRow, CompileRow
from .sources import RunnerSource
from .workload import build_model_runner

HARNESS_PARENT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class CaptureSettings:
    """What the capture section runs."""

    presets: tuple[str, ...]
    decode_max_bs: int
    prefill_max_tokens: int
    compile_preset: str
    compile_buckets: tuple[int, ...]
    attention_backend: str = "torch"
    backends: tuple[tuple[str, BenchConfig], ...] = CAPTURE_BACKENDS
    """(phase, runner row) pairs to capture: ``CAPTURE_BACKENDS``, or those ``--configs`` names."""


def run_capture(result: BenchResult, settings: CaptureSettings, models: ModelCache) -> None:
    """Capture the default buckets with every backend of ``settings.backends`` and add one row each."""
    max_sizes = {"decode": settings.decode_max_bs, "prefill": settings.prefill_max_tokens}
    for preset in settings.presets:
        # Capture only writes the scratch slot: a few KV slots are enough, whatever the request and token counts.
        cache = CacheConfig(
            max_num_reqs=settings.decode_max_bs, max_context_len=settings.prefill_max_tokens, num_kv_slots=1024
        )
        model_runner = build_model_runner(preset, cache, settings.attention_backend, models.get(preset))
        for phase, config in settings.backends:
            shapes = default_shapes(phase, max_sizes[phase])
            with guarded(result, "capture", f"{preset} {phase} {config.name}", config):
                source = make_source(config, model_runner, {phase: shapes})
                assert isinstance(source, RunnerSource)
                try:
                    result.capture.append(_capture_row(preset, phase, config.name, source))
                finally:
                    source.close()
        model_runner.shutdown()
        del model_runner
        gc.collect()
        torch.cuda.empty_cache()


def _capture_row(preset: str, phase: str, backend: str, source: RunnerSource) -> CaptureRow:
    """The first capture (made by the source), then shutdown, the estimate, and a repeat capture it predicts."""
    first = source.stats
    runner = source.runner
    runner.shutdown()
    estimate = runner.estimate_capture_memory(refresh=True)
    repeat = runner.capture()
    return CaptureRow(
        preset,
        phase,
        backend,
        first.graphs,
        first.seconds,
        first.bytes,
        repeat_seconds=repeat.seconds,
        repeat_bytes=repeat.bytes,
        estimate_bytes=estimate.total_bytes if estimate.probes else None,
        estimate_seconds=estimate.seconds,
    )


def _probe(settings: CaptureSettings, cache_dir: Path) -> dict[str, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HARNESS_PARENT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")
    env["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
    command = [
        sys.executable, "-m", "harness.compile_probe", "--preset", settings.compile_preset,
        "--attention-backend", settings.attention_backend, "--buckets", *map(str, settings.compile_buckets),
    ]  # fmt: skip
    completed = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        tail = (completed.stderr or completed.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"the compile probe exited {completed.returncode}: {' | '.join(tail)}")
    return json.loads(completed.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run_compile(result: BenchResult, settings: CaptureSettings) -> None:
    """``tc_piecewise`` with inductor pieces: compile seconds cold, then warm, each in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="cudagraph-bench-compile-cache-") as cache_name:
        cold = _probe(settings, Path(cache_name))
        warm = _probe(settings, Path(cache_name))
    result.compile.append(
        CompileRow(
            preset=settings.compile_preset,
            compiler="inductor",
            cold_seconds=cold["compile_seconds"],
            warm_seconds=warm["compile_seconds"],
            cold_capture_seconds=cold["capture_seconds"],
            warm_capture_seconds=warm["capture_seconds"],
        )
    )
