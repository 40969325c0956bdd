"""Prefill section: every row of ``PREFILL_CONFIGS`` on each batch shape (requests x tokens per request), with the
speed-up over eager on the same shape."""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from cudagraph.engine.model_runner import CacheConfig

from .configs import PREFILL_CONFIGS, BenchConfig, measurement_order, table_position
from .make_source import make_source
from .measure import guarded, measure_step
from .models import ModelCache
from .profiles import Iterations
from .rows import BenchResult, PrefillRow, with_speedups
from .workload import build_model_runner, extend_batches

PREFILL_SHAPES: tuple[tuple[int, int], ...] = ((1, 16), (1, 64), (1, 256), (1, 1024), (8, 64))
"""(requests, tokens per request) of the full run."""


@dataclass(frozen=True)
class PrefillSettings:
    """What the prefill section runs."""

    presets: tuple[str, ...]
    shapes: tuple[tuple[int, int], ...]
    iterations: Iterations
    attention_backend: str = "torch"
    configs: tuple[BenchConfig, ...] = PREFILL_CONFIGS
    kernel_backend: str = "auto"
    """The engine's kernel set (``auto``, ``torch``, ``triton``, ...); a row that compiles the forward gets the set
    the engine would pick for it (``ModelRunner.kernels_for``: with ``auto`` on CUDA, ``triton`` for tc_piecewise)."""

    @property
    def token_buckets(self) -> tuple[int, ...]:
        """The token counts the runners capture: exactly the shapes measured."""
        return tuple(sorted({requests * tokens for requests, tokens in self.shapes}))


def run_prefill(result: BenchResult, settings: PrefillSettings, models: ModelCache) -> None:
    """Measure every prefill configuration of ``settings`` and add the rows."""
    most_requests = max(requests for requests, _ in settings.shapes)
    longest = max(tokens for _, tokens in settings.shapes)
    for preset in settings.presets:
        cache = CacheConfig(max_num_reqs=most_requests + 1, max_context_len=longest)
        model_runner = build_model_runner(
            preset, cache, settings.attention_backend, models.get(preset), settings.kernel_backend
        )
        rows: list[PrefillRow] = []
        for config in measurement_order(settings.configs):
            what = f"{preset} {config.name}"
            with guarded(result, "prefill", what, config):
                source = make_source(config, model_runner, {"prefill": settings.token_buckets})
                try:
                    for requests, tokens in settings.shapes:
                        shape_what = f"{what} {requests}x{tokens}"
                        with (
                            guarded(result, "prefill", shape_what, config),
                            extend_batches(model_runner, requests, tokens) as batches,
                        ):
                            step = source.step_for(batches)
                            measured = measure_step(
                                result,
                                "prefill",
                                shape_what,
                                step,
                                model_runner.forward,
                                batches,
                                settings.iterations,
                                count_kernels=False,
                            )
                            if measured is not None:
                                rows.append(
                                    PrefillRow(
                                        preset=preset,
                                        backend=config.name,
                                        requests=requests,
                                        tokens_per_request=tokens,
                                        step_ms=measured.timing.step_ms,
                                        host_us=measured.timing.host_us,
                                    )
                                )
                finally:
                    source.close()
        rows.sort(key=table_position(settings.configs))
        result.prefill += with_speedups(rows)
        model_runner.shutdown()
        del model_runner
        gc.collect()
        torch.cuda.empty_cache()
