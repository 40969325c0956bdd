"""Draft rows of the speculative section: EAGLE drafting, eager against graphed, beside the target.

For each ``k`` of ``SpeculativeSettings.eagle_drafts``, over the preset's target (random weights) with a random EAGLE
head (``cudagraph.engine.model.eagle``):

- ``eager ms`` / ``graph ms``: one draft round of ``eagle_batch_size`` requests over ``context_len`` cached tokens:
  the draft extend of ``k + 1`` rows a request (``DraftExtendCudaGraphRunner``) then the chain of ``k - 1`` draft
  steps (``DraftCudaGraphRunner``), run eagerly (the runners' own eager paths) against their graphs' replays (the
  decode phase's ``full`` backend). Graphed seeds and drafts are checked against eager's first.
- ``draft capture s`` / ``decode capture s``: capturing both draft runners against capturing the target's decode
  runner, for the same buckets (``verify_batch_sizes`` and the batch size), after one eager run of every step both
  capture and one untimed capture of each (so neither pays alone for kernel compiles and autotuning, which Triton's
  on-disk cache keeps across start-ups).
- ``self-draft tok/step``: tokens a request gains per verify step when the head is the self-draft head over a
  one-layer target of the preset's shape (every draft agrees with the target up to bf16 rounding): ``k + 1`` at best.

It measures; it never changes how the engine runs a step.
"""

from __future__ import annotations

import dataclasses
import gc
import time

import torch

from cudagraph.config import CudaGraphConfig
from cudagraph.engine.batch import SamplingParams
from cudagraph.engine.eagle import EagleModelRunner
from cudagraph.engine.generate import Scheduler, StepPolicy
from cudagraph.engine.model import random_model
from cudagraph.engine.model.eagle import random_eagle_head, self_draft_head
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.engine.speculative import EagleDrafter
from cudagraph.runner import DraftCudaGraphRunner, DraftExtendCudaGraphRunner, ForwardBatch, ForwardMode

from .measure import guarded
from .models import ModelCache
from .presets import preset_config
from .rows import BenchResult, DraftRow, WrongAnswer
from .speculative import SECTION, SPECULATIVE_CONFIG, SpeculativeSettings, verify_capable_engine
from .timing import time_steps
from .workload import verify_batches

SELF_DRAFT_NEW_TOKENS = 64
"""Tokens the self-draft run generates for its one request (after the prefill's)."""


def run_drafting(result: BenchResult, settings: SpeculativeSettings, models: ModelCache) -> None:
    """Add a ``DraftRow`` per preset and ``k`` of ``settings.eagle_drafts``."""
    buckets = tuple(sorted({*settings.verify_batch_sizes, settings.eagle_batch_size}))
    config = SPECULATIVE_CONFIG.runner_config({"decode": buckets})
    for preset in settings.presets:
        for drafts in settings.eagle_drafts:
            what = f"{preset} eagle draft k={drafts}"
            with guarded(result, SECTION, what, SPECULATIVE_CONFIG):
                row = _draft_row(result, settings, models, preset, drafts, config, len(buckets))
                if row is not None:
                    result.draft.append(row)
            gc.collect()
            torch.cuda.empty_cache()


def _draft_row(
    result: BenchResult,
    settings: SpeculativeSettings,
    models: ModelCache,
    preset: str,
    drafts: int,
    config: CudaGraphConfig,
    graphs: int,
) -> DraftRow | None:
    target = verify_capable_engine(result, preset, settings, models, config)
    eagle = EagleModelRunner(target, random_eagle_head(target.model, seed=0), drafts)  # type: ignore[arg-type]
    try:
        size = settings.eagle_batch_size
        with verify_batches(target, size, drafts, settings.context_len) as batches:
            extend_batch, chain_batch = _draft_batches(
                batches[0], drafts, target.model.config.hidden_size, target.dtype
            )
            # Every kernel both captures launch runs eagerly first (JIT compiles, autotuning, library handles), so
            # neither capture is charged for them alone.
            target.forward(batches[0])
            target.forward(chain_batch)
            eagle.draft_extend(extend_batch)
            if drafts > 1:
                eagle.draft_steps(chain_batch)
            # A first capture of each compiles the kernel variants only a capture runs (the graph path's attention
            # and the padded buckets' shapes: Triton JIT, about 1 s the first time); the timed captures after it
            # measure capturing, as a start-up whose Triton cache is warm does.
            target.init_decode_cuda_graph()
            eagle.init_cuda_graphs()
            eagle.shutdown()
            target.shutdown()
            decode_capture_s = _seconds(target.init_decode_cuda_graph)
            draft_capture_s = _seconds(eagle.init_cuda_graphs)
            chain, extend = eagle.draft_cuda_graph_runner, eagle.draft_extend_cuda_graph_runner
            assert extend is not None, "decode graphs are off in the section's own config"

            def eager(index: int) -> object:
                seed = extend.extend_eagerly(extend_batch)
                return (seed, chain.draft_eagerly(chain_batch)) if chain is not None else seed

            def graphed(index: int) -> object:
                seed = extend.replay(extend_batch)
                return (seed, chain.replay(chain_batch)) if chain is not None else seed

            detail = _mismatch(extend, chain, extend_batch, chain_batch)
            if detail is not None:
                result.wrong.append(WrongAnswer(SECTION, f"{preset} eagle draft k={drafts}", detail))
                return None
            eager_timing = time_steps(eager, settings.iterations)
            graph_timing = time_steps(graphed, settings.iterations)
        return DraftRow(
            preset=preset,
            attention_backend=target.attention_backend_name,
            requests=size,
            drafts=drafts,
            eager_ms=eager_timing.step_ms,
            graph_ms=graph_timing.step_ms,
            eager_host_us=eager_timing.host_us,
            graph_host_us=graph_timing.host_us,
            graphs=graphs,
            draft_capture_s=draft_capture_s,
            decode_capture_s=decode_capture_s,
            self_draft_tokens_per_step=_self_draft_tokens_per_step(
                settings, preset, drafts, config, target.attention_backend_name
            ),
        )
    finally:
        eagle.shutdown()
        target.shutdown()


def _seconds(capture: object) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    capture()  # type: ignore[operator]
    torch.cuda.synchronize()
    return time.perf_counter() - started


def _draft_batches(
    verify: ForwardBatch, drafts: int, hidden_size: int, dtype: torch.dtype
) -> tuple[ForwardBatch, ForwardBatch]:
    """The draft extend batch (the verify batch's rows, every row real, random hidden states) and the chain's first
    step (each request's first verify row as a decode row: the chain's steps write the rows after it)."""
    query_len = drafts + 1
    generator = torch.Generator(device=verify.input_ids.device).manual_seed(drafts)
    device = verify.input_ids.device

    def hidden(rows: int) -> torch.Tensor:
        return torch.randn((rows, hidden_size), generator=generator, device=device).to(dtype)

    size = verify.batch_size
    accepted = torch.full((size,), query_len, dtype=torch.int64, device=device)
    extend = dataclasses.replace(verify, hidden_states=hidden(size * query_len), accepted_lens=accepted, route=None)
    first = torch.arange(size, device=device) * query_len
    seq_lens_cpu = verify.seq_lens_cpu - drafts if verify.seq_lens_cpu is not None else None
    chain = ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=size,
        input_ids=verify.input_ids.index_select(0, first),
        positions=verify.positions.index_select(0, first),
        seq_lens=verify.seq_lens - drafts,
        req_pool_indices=verify.req_pool_indices,
        out_cache_loc=verify.out_cache_loc.index_select(0, first),
        seq_lens_sum=verify.seq_lens_sum - drafts * size,
        seq_lens_cpu=seq_lens_cpu,
        hidden_states=hidden(size),
    )
    return extend, chain


def _mismatch(
    extend: DraftExtendCudaGraphRunner,
    chain: DraftCudaGraphRunner | None,
    extend_batch: ForwardBatch,
    chain_batch: ForwardBatch,
) -> str | None:
    """What differs between the graphed round and the eager one (the seeds' tokens, the chain's drafts), or None."""
    eager_seed = extend.extend_eagerly(extend_batch).tokens.tolist()
    graph_seed = extend.replay(extend_batch).tokens.tolist()
    if eager_seed != graph_seed:
        return f"draft extend seeds: graph {graph_seed} != eager {eager_seed}"
    if chain is None:
        return None
    eager_drafts = chain.draft_eagerly(chain_batch).tolist()
    graph_drafts = chain.replay(chain_batch).tolist()
    if eager_drafts != graph_drafts:
        return f"draft chain tokens: graph {graph_drafts} != eager {eager_drafts}"
    return None


def _self_draft_tokens_per_step(
    settings: SpeculativeSettings, preset: str, drafts: int, config: CudaGraphConfig, attention_backend: str
) -> float:
    """Tokens a request gains per verify step with the self-draft head over a one-layer target of ``preset``'s shape
    (graphed target and drafts), generating ``SELF_DRAFT_NEW_TOKENS`` after a ``context_len``-token prompt."""
    one_layer = preset_config(preset).with_overrides(num_layers=1)
    model = random_model(one_layer, seed=0, dtype="bfloat16", device="cuda")
    target = ModelRunner(
        model,
        config,
        cache_config=CacheConfig(
            max_num_reqs=2, max_context_len=settings.context_len + SELF_DRAFT_NEW_TOKENS + 2 * drafts
        ),
        attention_backend=attention_backend,
        kernel_backend=settings.kernel_backend,
        keep_hidden_states=drafts + 1,
    )
    eagle = EagleModelRunner(target, self_draft_head(model), drafts)
    try:
        target.init_decode_cuda_graph()
        target.init_verify_cuda_graph(drafts + 1)
        eagle.init_cuda_graphs()
        scheduler = Scheduler(target, policy=StepPolicy(drafter=EagleDrafter(eagle)))
        generator = torch.Generator().manual_seed(0)
        prompt = torch.randint(0, one_layer.vocab_size, (settings.context_len,), generator=generator)
        scheduler.run([prompt.tolist()], SamplingParams(max_new_tokens=SELF_DRAFT_NEW_TOKENS + 1))
        stats = scheduler.stats
        return (stats.verify_steps + stats.accepted_tokens) / max(stats.verify_steps, 1)
    finally:
        eagle.shutdown()
        target.shutdown()
