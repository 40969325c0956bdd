"""Micro-benchmark of the graph backends on a Llama-shaped decode step (a script, not a test).

    python3 bench/bench_backend.py [--out FILE.json] [--layers 16] [--hidden 1024] [--steps 300]

Prints, in one run: the eager step, one full graph, the breakable graph with one eager break per layer (the
attention op, which writes the KV cache in place), and two host costs per break: the primitive's own (a graph whose
breaks call a function that does nothing, against the same kernels as one graph) and the model's (how much longer
a breakable step takes than a full one, per break). Needs CUDA; imports only torch and the workspace sources.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(path) for path in sorted(ROOT.glob("packages/*/src"))]

from cudagraph.backend import make_backend  # noqa: E402
from cudagraph.backend_utils import (  # noqa: E402
    BreakableCUDAGraph,
    ForwardContext,
    add_eager,
    capture_cuda_graph,
    get_forward_context,
    new_graph_pool,
    register_break_op,
    set_forward_context,
)

_LIBRARY = torch.library.Library("cudagraph_bench", "DEF")
_LIBRARY.define("attention(Tensor q, Tensor kv, Tensor(a!) output, int layer_id) -> ()")


@dataclass
class StepState:
    """Per-step attention inputs, in static buffers the runner would fill before each replay."""

    position: torch.Tensor  # [1] int64: where this step's key and value go
    mask: torch.Tensor  # [1, 1, 1, S] additive mask: 0 up to the position, -inf after


class KVCache:
    """Keys and values of every layer, ``[layers, S, 2, kv_heads, head_dim]``, written in place, with the per-layer
    views the attention op uses made once (as an attention backend prepares its metadata once)."""

    def __init__(self, layers: int, max_positions: int, heads: int, kv_heads: int, head_dim: int) -> None:
        self.kv = torch.randn(layers, max_positions, 2, kv_heads, head_dim, device="cuda").to(torch.bfloat16)
        self.layer_kv = list(self.kv.unbind(0))  # [S, 2, kv_heads, D] each
        self.keys = [layer[:, 0].transpose(0, 1).unsqueeze(0) for layer in self.layer_kv]  # [1, kv_heads, S, D]
        self.values = [layer[:, 1].transpose(0, 1).unsqueeze(0) for layer in self.layer_kv]
        self.new_kv_shape = (1, 2, kv_heads, head_dim)
        self.q_shape = (1, heads, 1, head_dim)


def _attention(q: torch.Tensor, kv: torch.Tensor, output: torch.Tensor, layer_id: int) -> None:
    context = get_forward_context()
    cache: KVCache = context.attn_backend
    state: StepState = context.forward_batch
    cache.layer_kv[layer_id].index_copy_(0, state.position, kv.view(cache.new_kv_shape))
    result = F.scaled_dot_product_attention(
        q.view(cache.q_shape), cache.keys[layer_id], cache.values[layer_id], attn_mask=state.mask, enable_gqa=True
    )
    output.view(cache.q_shape).copy_(result)


_LIBRARY.impl("attention", _attention, "CompositeExplicitAutograd")
ATTENTION = torch.ops.cudagraph_bench.attention
register_break_op(ATTENTION)


class LlamaStack(torch.nn.Module):
    """Embedding, layers of (RMSNorm, fused QKV, rotary-free GQA attention op, RMSNorm, SwiGLU), LM head; bf16."""

    def __init__(self, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> None:
        super().__init__()
        self.layers, self.heads, self.kv_heads = layers, heads, kv_heads
        self.head_dim = hidden // heads

        def weight(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, device="cuda") / math.sqrt(shape[-1])).to(torch.bfloat16)

        q_size, kv_size = hidden, 2 * kv_heads * self.head_dim
        self.q_size, self.kv_size = q_size, kv_size
        self.embed = weight(vocab, hidden)
        self.qkv = [weight(q_size + kv_size, hidden) for _ in range(layers)]
        self.o = [weight(hidden, hidden) for _ in range(layers)]
        self.gate_up = [weight(2 * ffn, hidden) for _ in range(layers)]
        self.down = [weight(hidden, ffn) for _ in range(layers)]
        self.lm_head = weight(vocab, hidden)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits of one decode step at batch 1."""
        hidden = F.embedding(input_ids, self.embed)
        for layer in range(self.layers):
            x = F.rms_norm(hidden, (hidden.shape[-1],))
            q, kv = F.linear(x, self.qkv[layer]).split((self.q_size, self.kv_size), dim=-1)
            attention_out = torch.empty_like(q)
            ATTENTION(q, kv.contiguous(), attention_out, layer)
            hidden = hidden + F.linear(attention_out, self.o[layer])
            x = F.rms_norm(hidden, (hidden.shape[-1],))
            gate, up = F.linear(x, self.gate_up[layer]).chunk(2, dim=-1)
            hidden = hidden + F.linear(F.silu(gate) * up, self.down[layer])
        return F.linear(F.rms_norm(hidden, (hidden.shape[-1],)), self.lm_head)


@dataclass
class Timing:
    """Median per step: wall time (launch to GPU done) and host time (until the call returns)."""

    wall_ms: float
    host_ms: float


def time_step(step: Callable[[], object], steps: int, warmup: int = 30) -> Timing:
    """Medians over ``steps`` synchronized runs of ``step``."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    walls, hosts = [], []
    for _ in range(steps):
        started = time.perf_counter()
        step()
        returned = time.perf_counter()
        torch.cuda.synchronize()
        finished = time.perf_counter()
        hosts.append(returned - started)
        walls.append(finished - started)
    return Timing(wall_ms=1e3 * statistics.median(walls), host_ms=1e3 * statistics.median(hosts))


def primitive_host_cost_per_break(breaks: int, steps: int) -> tuple[float, float]:
    """Host µs per break of the primitive alone, and its wall µs: the same tiny kernels as one graph, then split
    by ``breaks`` eager calls of a function that does nothing."""
    static = torch.zeros(1024, device="cuda")

    def do_nothing() -> None:
        return None

    def kernels(with_breaks: bool) -> None:
        for _ in range(breaks):
            static.add_(1.0)
            static.mul_(0.5)
            if with_breaks:
                add_eager(do_nothing)
        static.add_(1.0)

    stream = torch.cuda.Stream()
    for _ in range(3):
        with torch.cuda.stream(stream):
            kernels(False)
    torch.cuda.synchronize()
    full_graph, _ = capture_cuda_graph(lambda: kernels(False), pool=new_graph_pool(), stream=stream)
    breakable = BreakableCUDAGraph(pool=new_graph_pool())
    with breakable.capture(stream):
        kernels(True)
    assert full_graph is not None and breakable.num_eager_calls == breaks
    full = time_step(full_graph.replay, steps)
    split = time_step(breakable.replay, steps)
    full_graph.reset()
    breakable.reset()
    return 1e3 * (split.host_ms - full.host_ms) / breaks, 1e3 * (split.wall_ms - full.wall_ms) / breaks


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print (and optionally write) the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the results here as JSON")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=16, help="(grouped-query attention takes SDPA's slow path)")
    parser.add_argument("--ffn", type=int, default=3072)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--context", type=int, default=1024, help="KV positions attended (the cache length)")
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_backend needs a CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    model = LlamaStack(args.layers, args.hidden, args.heads, args.kv_heads, args.ffn, args.vocab)
    cache = KVCache(args.layers, args.context, args.heads, args.kv_heads, args.hidden // args.heads)
    position = args.context // 2
    mask = torch.full((1, 1, 1, args.context), float("-inf"), device="cuda", dtype=torch.bfloat16)
    mask[..., : position + 1] = 0
    state = StepState(position=torch.tensor([position], device="cuda"), mask=mask)
    context = ForwardContext(forward_batch=state, attn_backend=cache)
    static_input_ids = torch.tensor([17], device="cuda")

    def forward() -> torch.Tensor:
        with set_forward_context(context):
            return model(static_input_ids)

    with torch.no_grad():
        eager = time_step(forward, args.steps)
        results: dict[str, Timing] = {"eager": eager}
        outputs = {}
        for name in ("full", "breakable"):
            backend = make_backend("decode", name, "cuda", share_global_pool=False)
            with backend.capture_session():
                backend.capture_one(1, forward)

            def replay(backend=backend) -> torch.Tensor:
                with set_forward_context(context):
                    return backend.replay(1)

            results[name] = time_step(replay, args.steps)
            outputs[name] = replay().clone()
            backend.cleanup()
        reference = forward()
        # What one eager break's own work costs on the host: the attention op called directly.
        sample_q = torch.randn(1, args.hidden, device="cuda", dtype=torch.bfloat16)
        sample_kv = torch.randn(1, model.kv_size, device="cuda", dtype=torch.bfloat16)
        sample_out = torch.empty_like(sample_q)
        with set_forward_context(context):
            attention_call = time_step(lambda: ATTENTION(sample_q, sample_kv, sample_out, 0), args.steps)
        primitive_host_us, primitive_wall_us = primitive_host_cost_per_break(args.layers, args.steps)

    full, breakable = results["full"], results["breakable"]
    summary = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "config": vars(args) | {"out": str(args.out) if args.out else None},
        "timings_ms": {name: asdict(timing) for name, timing in results.items()},
        "breaks": args.layers,
        "breakable_over_full": breakable.wall_ms / full.wall_ms,
        "model_wall_us_per_break": 1e3 * (breakable.wall_ms - full.wall_ms) / args.layers,
        "model_host_us_per_break": 1e3 * (breakable.host_ms - full.host_ms) / args.layers,
        "primitive_host_us_per_break": primitive_host_us,
        "attention_op_host_us": 1e3 * attention_call.host_ms,
        "primitive_wall_us_per_break": primitive_wall_us,
        "max_abs_diff_vs_eager": {
            name: (output.float() - reference.float()).abs().max().item() for name, output in outputs.items()
        },
    }
    print(
        f"{summary['device']}, torch {summary['torch']}: {args.layers} layers, hidden {args.hidden}, batch 1, "
        f"KV cache {args.context} positions"
    )
    for name, timing in results.items():
        print(f"  {name:<10} {timing.wall_ms:8.3f} ms/step   (host {timing.host_ms:.3f} ms)")
    print(f"  breakable / full                    {summary['breakable_over_full']:.3f}x  (target <= 1.3x)")
    print(
        f"  host cost per eager break, primitive {primitive_host_us:6.2f} us  (target <= 15 us; wall "
        f"{primitive_wall_us:.2f} us)"
    )
    print(
        f"  model: breakable - full per break    {summary['model_wall_us_per_break']:6.2f} us wall, "
        f"{summary['model_host_us_per_break']:.2f} us host (includes the eager attention's own launches)"
    )
    print(f"  the eager attention op alone         {1e3 * attention_call.host_ms:6.2f} us host per call")
    print(f"  max |graph - eager|: {summary['max_abs_diff_vs_eager']}")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2))
        print(f"  wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
