"""Host cost of the ways an eager step could reach the Triton kernel set (a script, not a test): what a check at each
call site would cost, and what calling the custom op instead of the plain function costs.

    python3 bench/bench_traced_ops.py [--calls 200000] [--out FILE.json]

Rows, each the median over ``--repeat`` runs of ``--calls`` calls, in µs a call:

- ``plain call``: a Python function that returns a constant (the floor of any call).
- ``torch.compiler.is_compiling()`` and ``torch.compiler.is_dynamo_compiling()``: a check at the call site.
- ``custom op, dispatched`` against ``its function, direct``: a trivial ``torch.library.custom_op`` on a small CPU
  tensor through ``torch.ops`` against the same Python body called directly (the dispatcher's own cost).
- With CUDA and Triton: ``linear`` at one row of Qwen3-0.6B's q/k/v projection, the engine's plain function
  (FastLauncher) against ``torch.ops.cudagraph_triton.linear``: host time to enqueue a launch.

The engine's choice (``kernels.triton.traced_ops``): eager steps call the plain functions and dynamo substitutes the
ops while tracing, so an eager step pays none of these.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(path) for path in sorted(ROOT.glob("packages/*/src"))]


def per_call_us(call: Callable[[], object], calls: int, repeat: int) -> float:
    """Median over ``repeat`` runs of the wall time of ``calls`` calls, in µs a call."""
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        runs.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(runs)


@torch.library.custom_op("bench_traced_ops::scale", mutates_args=())
def _scale_op(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _plain() -> bool:
    return False


def rows(calls: int, repeat: int) -> dict[str, float]:
    """Every row this machine can measure."""
    x = torch.ones(8)
    measured = {
        "plain call": per_call_us(_plain, calls, repeat),
        "torch.compiler.is_compiling()": per_call_us(torch.compiler.is_compiling, calls, repeat),
        "torch.compiler.is_dynamo_compiling()": per_call_us(torch.compiler.is_dynamo_compiling, calls, repeat),
        "its function, direct": per_call_us(lambda: _scale(x), calls // 10, repeat),
        "custom op, dispatched": per_call_us(lambda: torch.ops.bench_traced_ops.scale(x), calls // 10, repeat),
    }
    if torch.cuda.is_available():
        measured.update(cuda_rows(calls // 100, repeat))
    return measured


def cuda_rows(calls: int, repeat: int) -> dict[str, float]:
    """``linear`` at one row of Qwen3-0.6B's q/k/v projection, bfloat16: plain function against the custom op."""
    from cudagraph.engine.kernels.triton import traced_ops

    x = torch.randn(1, 1024, dtype=torch.bfloat16, device="cuda")
    weight = torch.randn(4096, 1024, dtype=torch.bfloat16, device="cuda")
    traced_ops.linear(x, weight)  # compile the kernel
    torch.cuda.synchronize()

    def timed(call: Callable[[], object]) -> float:
        result = per_call_us(call, calls, repeat)
        torch.cuda.synchronize()
        return result

    return {
        "linear, plain function (FastLauncher)": timed(lambda: traced_ops.linear(x, weight)),
        "linear, torch.ops.cudagraph_triton.linear": timed(lambda: torch.ops.cudagraph_triton.linear(x, weight, None)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    measured = rows(args.calls, args.repeat)
    width = max(map(len, measured))
    for name, value in measured.items():
        print(f"{name:<{width}}  {value:8.3f} µs")
    if args.out:
        args.out.write_text(json.dumps({"us_per_call": measured}, indent=2) + "\n")


if __name__ == "__main__":
    main()
