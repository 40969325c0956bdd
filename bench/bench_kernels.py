"""Micro-benchmark of the decode projections (a script, not a test): cuBLAS against Triton's ``gemv`` at the table's
tile and at every tile of a sweep, for a preset's four projection shapes and a few step widths.

    python3 bench/bench_kernels.py [--preset qwen3-0.6b-random] [--rows 1 2 4 8] [--sweep] [--out FILE.json]

Every figure is one launch's GPU time inside a CUDA graph (``--repeat`` launches captured back to back, the graph
replayed ``--replays`` times, the median replay divided by the launches), so launch gaps count as they do in a
captured decode step; the weight-read floor is the weight's bytes over the device's copy bandwidth. Prints a table
per shape and writes the figures (and the best swept tile per shape and width) as JSON. Needs CUDA and Triton.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(path) for path in sorted(ROOT.glob("packages/*/src"))]

from cudagraph.engine.kernels.triton.ops import GemvTile, gemv, gemv_tile, silu_and_mul  # noqa: E402
from cudagraph.engine.model import model_config_from_preset  # noqa: E402

SWEEP_BLOCK_N = (2, 4, 8)
SWEEP_BLOCK_K = (512, 1024, 2048, 4096)
SWEEP_WARPS = (4, 8)
MAX_TILE_ELEMENTS = 16384
"""Register tile bound of the sweep: rows x block_n x block_k float32 products a program holds."""


@dataclass(frozen=True)
class Projection:
    """A decode projection: its name, ``weight`` ``[n, k]``, and whether its input is ``gate_up`` (the activation
    fused into the down projection)."""

    name: str
    n: int
    k: int
    silu_mul: bool = False


@dataclass
class Figure:
    """One measured launch: which projection, how many rows, which kernel (and tile), microseconds."""

    projection: str
    rows: int
    kernel: str
    microseconds: float
    tile: dict[str, int] | None = None


def projections(preset: str) -> list[Projection]:
    config = model_config_from_preset(preset)
    return [
        Projection("qkv", config.q_size + 2 * config.kv_size, config.hidden_size),
        Projection("o", config.hidden_size, config.q_size),
        Projection("gate_up", 2 * config.intermediate_size, config.hidden_size),
        Projection("down (silu*mul fused)", config.hidden_size, config.intermediate_size, silu_mul=True),
    ]


def graph_time_us(launch: Callable[[], object], repeat: int, replays: int) -> float:
    """Median GPU time of one ``launch`` inside a CUDA graph of ``repeat`` launches."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            launch()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeat):
            launch()
    for _ in range(3):
        graph.replay()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000 / repeat)
    return statistics.median(samples)


def sweep_tiles(rows: int, k: int) -> list[GemvTile]:
    return [
        GemvTile(rows, block_n, block_k, warps)
        for block_n, block_k, warps in itertools.product(SWEEP_BLOCK_N, SWEEP_BLOCK_K, SWEEP_WARPS)
        if block_k <= max(512, triton.next_power_of_2(k)) and rows * block_n * block_k <= MAX_TILE_ELEMENTS
    ]


def copy_bandwidth() -> float:
    source = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    seconds = graph_time_us(lambda: target.copy_(source), 1, 10) / 1e6
    return 2 * source.numel() / seconds


def measure(
    projection: Projection, rows: int, bandwidth: float, args: argparse.Namespace
) -> tuple[str, list[Figure], dict[str, object] | None]:
    """Time ``projection`` at ``rows``: cuBLAS, the table's tile, and (``args.sweep``) every swept tile. Returns the
    printed line, the figures and the fastest swept tile."""
    dtype = torch.bfloat16
    weight = torch.randn(projection.n, projection.k, dtype=dtype, device="cuda") / projection.k**0.5
    x = torch.randn(rows, 2 * projection.k if projection.silu_mul else projection.k, dtype=dtype, device="cuda")
    floor_us = weight.numel() * weight.element_size() / bandwidth * 1e6

    def cublas() -> torch.Tensor:
        return F.linear(silu_and_mul(x) if projection.silu_mul else x, weight)

    def triton(tile: GemvTile) -> Callable[[], torch.Tensor]:
        return lambda: gemv(x, weight, silu_mul=projection.silu_mul, tile=tile)

    cublas_us = graph_time_us(cublas, args.repeat, args.replays)
    figures = [Figure(projection.name, rows, "cublas", cublas_us)]
    line = f"{projection.name:>22} rows {rows}: floor {floor_us:6.2f} us | cuBLAS {cublas_us:6.2f} us"
    table_tile = gemv_tile(rows)
    if table_tile is not None:
        mine = graph_time_us(triton(table_tile), args.repeat, args.replays)
        figures.append(Figure(projection.name, rows, "triton", mine, asdict(table_tile)))
        line += f" | triton {mine:6.2f} us ({cublas_us / mine:4.2f}x)"
    if not args.sweep:
        return line, figures, None
    swept = []
    for tile in sweep_tiles(rows, projection.k):
        time_us = graph_time_us(triton(tile), args.repeat, 10)
        swept.append((time_us, tile))
        figures.append(Figure(projection.name, rows, "triton-sweep", time_us, asdict(tile)))
    fastest, tile = min(swept, key=lambda entry: entry[0])
    line += f" | best swept {fastest:6.2f} us (n {tile.block_n}, k {tile.block_k}, warps {tile.num_warps})"
    return line, figures, {"microseconds": fastest, "tile": asdict(tile)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3-0.6b-random")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--sweep", action="store_true", help="also time every tile of the sweep")
    parser.add_argument("--repeat", type=int, default=20, help="launches captured in one graph")
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("bench-results/bench_kernels.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_kernels needs a CUDA device")
    dtype = torch.bfloat16
    bandwidth = copy_bandwidth()
    figures: list[Figure] = []
    best: dict[str, dict[str, object]] = {}
    for projection, rows in itertools.product(projections(args.preset), args.rows):
        line, measured, fastest = measure(projection, rows, bandwidth, args)
        figures += measured
        if fastest is not None:
            best[f"{projection.name}@{rows}"] = fastest
        print(line, flush=True)
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "preset": args.preset,
        "dtype": str(dtype).removeprefix("torch."),
        "copy_bandwidth_gb_per_s": bandwidth / 1e9,
        "figures": [asdict(figure) for figure in figures],
        "best_swept": best,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
