"""Decode section: every row of ``DECODE_CONFIGS`` at every batch size, per preset, with ratios to the raw replay
and to eager, device activities per step, host time, and the weight-bandwidth floor."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from cudagraph.engine.model_runner import CacheConfig

from .configs import DECODE_CONFIGS, BenchConfig, measurement_order, table_position
from .make_source import make_source
from .measure import guarded, measure_step
from .models import ModelCache
from .profiles import Iterations
from .rows import BenchResult, DecodeRow, with_ratios
from .timing import weight_bytes
from .workload import build_model_runner, decode_batches


@contextlib.contextmanager
def pdl_setting(pdl: bool | None) -> Iterator[None]:
    """The engine's PDL switch set to ``pdl`` inside the block (a row's capture and timing); None leaves it be.
    Imports the Triton kernels only for a row that sets it."""
    if pdl is None:
        yield
        return
    from cudagraph.engine.kernels.triton.pdl import use_pdl

    with use_pdl(pdl):
        yield


@dataclass(frozen=True)
class DecodeSettings:
    """What the decode section runs."""

    presets: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    context_len: int
    iterations: Iterations
    attention_backend: str = "torch"
    configs: tuple[BenchConfig, ...] = DECODE_CONFIGS
    count_kernels: bool = True
    """Count device activities right after each row is timed (``kernel_pass`` says why a run usually does not)."""
    kernel_backend: str = "auto"
    """The engine's kernel set (``auto``, ``torch``, ``triton``, ...); a row that compiles the forward gets the set
    the engine would pick for it (``ModelRunner.kernels_for``: with ``auto`` on CUDA, ``triton`` for tc_piecewise)."""


def run_decode(result: BenchResult, settings: DecodeSettings, models: ModelCache, bandwidth: float) -> None:
    """Measure every decode configuration of ``settings`` and add the rows (and skips, and wrong answers)."""
    for preset in settings.presets:
        model = models.get(preset)
        floor_ms = weight_bytes(model) / bandwidth * 1e3
        cache = CacheConfig(max_num_reqs=max(settings.batch_sizes), max_context_len=2 * settings.context_len)
        model_runner = build_model_runner(preset, cache, settings.attention_backend, model, settings.kernel_backend)
        rows: list[DecodeRow] = []
        for config in measurement_order(settings.configs):
            what = f"{preset} {config.name}"
            with guarded(result, "decode", what, config), pdl_setting(config.pdl):
                source = make_source(config, model_runner, {"decode": settings.batch_sizes})
                kernel_set = model_runner.kernels.name  # the set the source runs, switched for a compiled forward
                try:
                    for batch_size in settings.batch_sizes:
                        with (
                            guarded(result, "decode", f"{what} bs {batch_size}", config),
                            decode_batches(model_runner, batch_size, settings.context_len) as batches,
                        ):
                            step = source.step_for(batches)
                            measured = measure_step(
                                result,
                                "decode",
                                f"{what} bs {batch_size}",
                                step,
                                model_runner.forward,
                                batches,
                                settings.iterations,
                                count_kernels=settings.count_kernels,
                            )
                            if measured is not None:
                                rows.append(
                                    DecodeRow(
                                        preset=preset,
                                        backend=config.name,
                                        batch_size=batch_size,
                                        step_ms=measured.timing.step_ms,
                                        host_us=measured.timing.host_us,
                                        kernels_per_step=measured.kernels_per_step,
                                        floor_ms=floor_ms,
                                        kernel_set=kernel_set,
                                    )
                                )
                finally:
                    source.close()
        rows.sort(key=table_position(settings.configs))
        result.decode += with_ratios(rows)
        model_runner.shutdown()
        del model_runner
        gc.collect()
        torch.cuda.empty_cache()
