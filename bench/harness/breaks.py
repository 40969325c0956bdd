"""Breaks section: the host cost of one eager break in our breakable primitive and in both peers, on the same work.

Two workloads, each against one full ``torch.cuda.CUDAGraph`` of the same kernels:

- ``model``: the 16-layer Llama-3.2-1B-shaped decode step at batch 1, broken at every attention op (16 breaks);
  every implementation runs the same eager attention, so the difference per break is the implementation's own.
- ``empty``: 16 pairs of tiny kernels split by breaks that call a function doing nothing: the primitive alone.

Cost per break = (implementation - full graph) / breaks, for the host time of a replay call and for the step time.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from cudagraph.backend_utils import BreakableCUDAGraph, ForwardContext, add_eager, new_graph_pool, set_forward_context
from cudagraph.engine.model_runner import CacheConfig

from .configs import BREAK_IMPLEMENTATIONS, BenchConfig, Kind
from .make_source import make_source
from .measure import guarded
from .models import ModelCache
from .peers import PEERS_BY_NAME, Peer, PeerUnavailableError
from .presets import BREAKS_PRESET, preset_config
from .profiles import Iterations
from .rows import BenchResult, BreakRow, WrongAnswer
from .sources import CapturedSource, RawGraphSource, SourceUnavailableError, refresh_graph_metadata
from .timing import StepTiming, time_steps
from .workload import build_model_runner, check_tokens, decode_batches

EMPTY_BREAKS = 16


@dataclass(frozen=True)
class BreakSettings:
    """What the breaks section runs."""

    iterations: Iterations
    context_len: int = 128
    attention_backend: str = "torch"
    preset: str = BREAKS_PRESET
    implementations: tuple[BenchConfig, ...] = BREAK_IMPLEMENTATIONS


def _row(implementation: str, workload: str, breaks: int, timing: StepTiming, full: StepTiming) -> BreakRow:
    return BreakRow(
        implementation=implementation,
        workload=workload,
        breaks=breaks,
        host_us_per_break=(timing.host_us - full.host_us) / breaks,
        wall_us_per_break=(timing.step_ms - full.step_ms) * 1e3 / breaks,
        step_ms=timing.step_ms,
    )


def run_model_breaks(result: BenchResult, settings: BreakSettings, models: ModelCache) -> None:
    """The ``model`` workload: each implementation captured around the same batch-1 decode forward."""
    breaks = preset_config(settings.preset).num_layers
    cache = CacheConfig(max_num_reqs=1, max_context_len=2 * settings.context_len)
    model_runner = build_model_runner(settings.preset, cache, settings.attention_backend, models.get(settings.preset))
    with decode_batches(model_runner, 1, settings.context_len) as batches:
        static = batches[0]
        eager_logits = model_runner.forward(static).float().clone()
        context = ForwardContext(forward_batch=static, attn_backend=model_runner.attn_backend, extra={})

        def timed(source: CapturedSource) -> tuple[StepTiming, torch.Tensor]:
            graph, output = source.capture_shape(static)
            refresh_graph_metadata(model_runner, static)
            with set_forward_context(context):
                timing = time_steps(lambda index: graph.replay(), settings.iterations)
            return timing, output.float().clone()

        reference = RawGraphSource(model_runner)
        full, _ = timed(reference)
        reference.close()
        for config in settings.implementations:
            what = f"{settings.preset} {config.name}"
            with guarded(result, "breaks", what, config):
                source = make_source(config, model_runner, {})
                assert isinstance(source, CapturedSource)
                try:
                    timing, logits = timed(source)
                finally:
                    source.close()
                check = check_tokens(eager_logits, logits)
                if not check.ok:
                    result.wrong.append(WrongAnswer("breaks", what, str(check)))
                    continue
                result.breaks.append(_row(config.name, "model", breaks, timing, full))
    model_runner.shutdown()
    gc.collect()
    torch.cuda.empty_cache()


def _do_nothing() -> None:
    return None


def _capture_ours(kernels: Callable[[Callable[[], None]], None]) -> Any:
    graph = BreakableCUDAGraph(pool=new_graph_pool())
    with graph.capture():
        kernels(lambda: add_eager(_do_nothing))
    return graph


def _peer_capturer(config: BenchConfig) -> Callable[[Callable[[Callable[[], None]], None]], Any]:
    assert config.peer is not None
    try:
        peer = Peer.load(PEERS_BY_NAME[config.peer])
    except PeerUnavailableError as error:
        raise SourceUnavailableError(str(error)) from None
    nothing = peer.no_graph(_do_nothing)

    def capture(kernels: Callable[[Callable[[], None]], None]) -> Any:
        graph = peer.new_graph()
        with peer.capture(graph):
            kernels(nothing)
        return graph

    return capture


def _replayer(graph: Any) -> Callable[[int], object]:
    return lambda index: graph.replay()


def run_empty_breaks(result: BenchResult, settings: BreakSettings) -> None:
    """The ``empty`` workload: the same tiny kernels as one graph and split by do-nothing breaks."""
    static = torch.zeros(1024, device="cuda")

    def kernels(brk: Callable[[], None]) -> None:
        for _ in range(EMPTY_BREAKS):
            static.add_(1.0)
            static.mul_(0.5)
            brk()
        static.add_(1.0)

    kernels(_do_nothing)
    torch.cuda.synchronize()
    full_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(full_graph):
        kernels(_do_nothing)
    full = time_steps(lambda index: full_graph.replay(), settings.iterations)
    for config in settings.implementations:
        with guarded(result, "breaks", f"empty {config.name}", config):
            capture = _capture_ours if config.kind is Kind.PRIMITIVE else _peer_capturer(config)
            graph: Any = capture(kernels)
            try:
                timing = time_steps(_replayer(graph), settings.iterations)
            finally:
                graph.reset()
            result.breaks.append(_row(config.name, "empty", EMPTY_BREAKS, timing, full))
    full_graph.reset()


def run_breaks(result: BenchResult, settings: BreakSettings, models: ModelCache) -> None:
    """Both workloads."""
    run_model_breaks(result, settings, models)
    run_empty_breaks(result, settings)
