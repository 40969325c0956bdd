"""Time of a batch-1 decode step of the model alone (a script, not a test): eager, one CUDA graph with a static-cache
sdpa attention, one graph of the model without attention, and one graph of the step's matmuls alone.

    python3 bench/bench_model_step.py [--preset qwen3-0.6b-random] [--out FILE.json]

The step is ``cudagraph.engine.static_step.DecodeStep``: no paged cache, no runner, so the figures are the model's
own floor under the engine's graphs. Each figure is the median over ``--repeats`` timed runs of ``--inner`` steps
(CUDA events), in milliseconds; the device activities are what one eager step puts on the GPU (each a graph node).
Prints one table and writes the figures as JSON. Needs CUDA. It asserts nothing: a timing is a measurement, and the
tests (``tests/gpu/model/test_model_gpu.py``) check what can be asserted (graph equals eager, work per layer).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(path) for path in sorted(ROOT.glob("packages/*/src"))]

from cudagraph.engine.kernels import TorchKernels  # noqa: E402
from cudagraph.engine.model import CausalLM, model_config_from_preset, random_model  # noqa: E402
from cudagraph.engine.static_step import DecodeStep, StaticKVCache, capture_step  # noqa: E402

PROMPT = list(range(100, 140))


def median_ms(fn: Callable[[], None], repeats: int, inner: int) -> float:
    """Median milliseconds of one call of ``fn`` over ``repeats`` CUDA-event-timed runs of ``inner`` calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return statistics.median(times)


def device_activities(fn: Callable[[], None]) -> int:
    """Kernels, copies and memsets one call of ``fn`` puts on the GPU."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        fn()
        torch.cuda.synchronize()
    return sum(1 for event in profiler.events() if event.device_type == torch.autograd.DeviceType.CUDA)


def capture_matmuls(model: CausalLM) -> Callable[[], None]:
    """A graph of only the step's matmuls at batch 1 (the weight-streaming part of a decode step)."""
    config = model.config
    hidden = torch.randn(1, config.hidden_size, dtype=model.dtype, device="cuda")
    attention = torch.randn(1, config.q_size, dtype=model.dtype, device="cuda")
    activation = torch.randn(1, config.intermediate_size, dtype=model.dtype, device="cuda")

    def matmuls() -> None:
        for layer in model.layers:
            F.linear(hidden, layer.self_attn.qkv_weight)
            F.linear(attention, layer.self_attn.o_weight)
            F.linear(hidden, layer.mlp.gate_up_weight)
            F.linear(activation, layer.mlp.down_weight)
        F.linear(hidden, model.lm_head)

    matmuls()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        matmuls()
    return graph.replay


@torch.inference_mode()
def measure(preset: str, repeats: int, inner: int) -> dict[str, object]:
    """Every figure of the table for ``preset``."""
    config = model_config_from_preset(preset)
    model = random_model(config, seed=0, device="cuda")
    cache = StaticKVCache(config, max_len=256, dtype=model.dtype)
    with_attention = DecodeStep(model, cache, advance=False)
    with_attention.prefill(PROMPT)
    model_only = DecodeStep(model, cache, attend=lambda layer_id, q, k, v: q, advance=False)
    figures: dict[str, object] = {
        "preset": preset,
        "device": torch.cuda.get_device_name(),
        "dtype": str(model.dtype).removeprefix("torch."),
        "weights_mib": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20,
        "eager_ms": median_ms(with_attention, repeats=max(repeats // 6, 1), inner=max(inner // 4, 1)),
        "graph_ms": median_ms(capture_step(with_attention).replay, repeats, inner),
        "model_only_graph_ms": median_ms(capture_step(model_only).replay, repeats, inner),
        "matmuls_graph_ms": median_ms(capture_matmuls(model), repeats, inner),
        "device_activities_model_only": device_activities(model_only),
        "device_activities_with_attention": device_activities(with_attention),
    }
    # What rounding the hidden-size norms exactly as transformers does (norm, round, then scale) would cost.
    with unfused_norm_scaling():
        figures["model_only_unfused_norm_graph_ms"] = median_ms(capture_step(model_only).replay, repeats, inner)
    return figures


@contextlib.contextmanager
def unfused_norm_scaling() -> Iterator[None]:
    """The torch kernels' norms rounded as transformers does them (norm, round, then scale), while inside."""
    saved = (TorchKernels.rms_norm, TorchKernels.add_rms_norm)
    TorchKernels.rms_norm = lambda self, x, w, eps: F.rms_norm(x, w.shape, eps=eps) * w  # type: ignore[method-assign]
    TorchKernels.add_rms_norm = lambda self, x, r, w, eps: (  # type: ignore[method-assign]
        F.rms_norm(r.add_(x), w.shape, eps=eps) * w,
        r,
    )
    try:
        yield
    finally:
        TorchKernels.rms_norm, TorchKernels.add_rms_norm = saved  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3-0.6b-random")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--inner", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_model_step: needs a CUDA device", file=sys.stderr)
        return 2
    figures = measure(args.preset, args.repeats, args.inner)
    for key, value in figures.items():
        print(f"{key:<36} {value:.3f}" if isinstance(value, float) else f"{key:<36} {value}")
    if args.out is not None:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
