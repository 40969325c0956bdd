"""Speculative section: the steps speculative decoding adds, each eager against graphed in the same run.

- ``verify``: ``B`` requests over cached context, each its last token and ``k`` drafts (logits of every token),
  replayed by the verify runner (``ModelRunner.init_verify_cuda_graph(k + 1)``: the decode phase's ``full`` graphs,
  one per request count).
- ``mixed``: one extend step of ``R`` running requests' next tokens beside a ``C``-token prompt chunk, replayed by
  the prefill runner (``breakable``, one graph per token count).
- ``draft`` (``drafting``, for each ``k`` of ``eagle_drafts``): an EAGLE draft round (draft extend and ``k - 1``
  chained draft steps) eager against graphed, the draft graphs' capture beside the target's decode capture, and the
  self-draft head's tokens a step.

Only attention backends that run verify steps (``supports_verify``: ``torch``, ``triton``) can measure it; with
another the section runs on ``triton`` and records why. It measures; it never changes how the engine runs a step.
"""

from __future__ import annotations

import gc
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import MappingProxyType

import torch

from cudagraph.config import CudaGraphConfig
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.runner import DecodeCudaGraphRunner, ForwardBatch, PrefillCudaGraphRunner

from .configs import BenchConfig, Kind
from .measure import guarded, measure_step
from .models import ModelCache
from .profiles import Iterations
from .rows import BenchResult, SpeculativeRow
from .timing import StepTiming
from .workload import StepFn, build_model_runner, mixed_batches, verify_batches

SECTION = "speculative"

SPECULATIVE_CONFIG = BenchConfig(
    "speculative",
    Kind.RUNNER,
    MappingProxyType({"decode_cuda_graph_backend": "full", "prefill_cuda_graph_backend": "breakable"}),
)
"""The graphs measured against eager: the engine's defaults, decode ``full`` (verify steps replay the decode phase's
backend) and prefill ``breakable``."""

VERIFY_FALLBACK_ATTENTION = "triton"
"""The attention backend the section runs on when the one asked for runs no verify steps."""


@dataclass(frozen=True)
class SpeculativeSettings:
    """What the speculative section runs."""

    presets: tuple[str, ...]
    verify_batch_sizes: tuple[int, ...]
    drafts: int
    """Drafts per request (``k``): a verify step feeds ``k + 1`` tokens a request."""
    mixed_shapes: tuple[tuple[int, int], ...]
    """(running requests, prompt chunk tokens) of each mixed step; a chunk is at most ``context_len`` tokens."""
    context_len: int
    iterations: Iterations
    attention_backend: str = "auto"
    kernel_backend: str = "auto"
    eagle_drafts: tuple[int, ...] = ()
    """``k`` of each EAGLE draft row (``drafting``): none, no draft rows."""
    eagle_batch_size: int = 1
    """Requests of the EAGLE draft rows' round."""

    @property
    def mixed_tokens(self) -> tuple[int, ...]:
        """The token counts of the mixed steps: the prefill buckets captured, exactly the shapes measured."""
        return tuple(sorted({running + chunk for running, chunk in self.mixed_shapes}))

    @property
    def most_requests(self) -> int:
        """Requests of the largest step (a mixed step's prompt counts as one)."""
        return max((*self.verify_batch_sizes, *(running + 1 for running, _ in self.mixed_shapes)), default=1)

    @property
    def cache(self) -> CacheConfig:
        """KV cache for the largest step, a request's context and drafts included (and the scratch row)."""
        return CacheConfig(max_num_reqs=self.most_requests + 2, max_context_len=self.context_len + self.drafts + 16)

    def phase_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shapes each phase captures: verify request counts (decode), mixed token counts (prefill)."""
        shapes = {"decode": tuple(sorted(set(self.verify_batch_sizes)))}
        if self.mixed_shapes:
            shapes["prefill"] = self.mixed_tokens
        return shapes


def run_speculative(result: BenchResult, settings: SpeculativeSettings, models: ModelCache) -> None:
    """Measure every verify and mixed step of ``settings``, eager and graphed, and add the rows."""
    config = SPECULATIVE_CONFIG.runner_config(settings.phase_shapes())
    for preset in settings.presets:
        model_runner = verify_capable_engine(result, preset, settings, models, config)
        try:
            with guarded(result, SECTION, f"{preset} verify k={settings.drafts}", SPECULATIVE_CONFIG):
                verify = model_runner.init_verify_cuda_graph(settings.drafts + 1)
                assert verify is not None, "decode graphs are off in the section's own config"
                for batch_size in settings.verify_batch_sizes:
                    what = f"{preset} verify bs {batch_size} k={settings.drafts}"
                    batches = verify_batches(model_runner, batch_size, settings.drafts, settings.context_len)
                    _measure(result, settings, model_runner, verify, what, batches, "verify", preset)
            if settings.mixed_shapes:
                with guarded(result, SECTION, f"{preset} mixed", SPECULATIVE_CONFIG):
                    prefill = model_runner.init_prefill_cuda_graph()
                    assert prefill is not None, "prefill graphs are off in the section's own config"
                    for running, chunk in settings.mixed_shapes:
                        what = f"{preset} mixed {running}+{chunk}"
                        batches = mixed_batches(model_runner, running, chunk, settings.context_len)
                        _measure(result, settings, model_runner, prefill, what, batches, "mixed", preset)
        finally:
            model_runner.shutdown()
            del model_runner
            gc.collect()
            torch.cuda.empty_cache()
    if settings.eagle_drafts:
        from .drafting import run_drafting  # it imports this module

        run_drafting(result, settings, models)


def verify_capable_engine(
    result: BenchResult, preset: str, settings: SpeculativeSettings, models: ModelCache, config: CudaGraphConfig
) -> ModelRunner:
    """The engine on the attention backend asked for, or on ``VERIFY_FALLBACK_ATTENTION`` (recorded as a skip of
    the one asked for) when that one runs no verify steps."""

    def build(attention_backend: str) -> ModelRunner:
        return build_model_runner(
            preset,
            settings.cache,
            attention_backend,
            models.get(preset),
            settings.kernel_backend,
            cuda_graph_config=config,
        )

    model_runner = build(settings.attention_backend)
    if getattr(model_runner.attn_backend, "supports_verify", False):
        return model_runner
    chosen = model_runner.attention_backend_name
    result.skip(
        SECTION,
        f"{preset} on {chosen} attention",
        f"the {chosen!r} attention backend runs no verify steps (supports_verify is false); measured on "
        f"{VERIFY_FALLBACK_ATTENTION!r} attention instead",
    )
    model_runner.shutdown()
    return build(VERIFY_FALLBACK_ATTENTION)


def _measure(
    result: BenchResult,
    settings: SpeculativeSettings,
    model_runner: ModelRunner,
    runner: DecodeCudaGraphRunner | PrefillCudaGraphRunner,
    what: str,
    batches_of: AbstractContextManager[list[ForwardBatch]],
    kind: str,
    preset: str,
) -> None:
    """Time one step shape eagerly and through ``runner`` (whose tokens are checked against eager's first) and add
    its row; a shape the runner would send eagerly is skipped with the runner's reason, not timed as a graph."""
    with guarded(result, SECTION, what, SPECULATIVE_CONFIG), batches_of as batches:
        route = runner.route(batches[0])
        if not route.replays:
            why = route.reason.text if route.reason is not None else "no graph"
            result.skip(SECTION, what, f"the {runner.phase} runner would run it eagerly: {why}")
            return
        timed: dict[str, StepTiming] = {}
        steps: tuple[tuple[str, StepFn], ...] = (("eager", model_runner.forward), ("graph", runner.replay))
        for label, step in steps:
            measured = measure_step(
                result, SECTION, f"{what} {label}", step, model_runner.forward, batches, settings.iterations,
                count_kernels=False,
            )  # fmt: skip
            if measured is None:
                return  # a wrong answer, recorded by measure_step
            timed[label] = measured.timing
        batch = batches[0]
        result.speculative.append(
            SpeculativeRow(
                kind=kind,
                preset=preset,
                attention_backend=model_runner.attention_backend_name,
                requests=batch.batch_size,
                tokens=int(batch.input_ids.shape[0]),
                drafts=settings.drafts if kind == "verify" else None,
                eager_ms=timed["eager"].step_ms,
                graph_ms=timed["graph"].step_ms,
                eager_host_us=timed["eager"].host_us,
                graph_host_us=timed["graph"].host_us,
            )
        )
