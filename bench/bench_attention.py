"""Micro-benchmark of the Triton decode attention kernel (a script, not a test): its default tile and, with
``--sweep``, every tile of a grid, over a preset's attention shape and a few (rows x cached tokens) cases.

    python3 bench/bench_attention.py [--preset qwen3-0.6b-random] [--cases 1x128 8x128 32x512 1x4000] [--sweep]

Every figure is one layer's launch inside a CUDA graph of one launch per decoder layer, each over its own layer of
a paged cache (so a launch finds no other layer's keys in L2, as in a decode step), replayed ``--replays`` times:
the median replay over the layers. A case runs in a cache of ``--max-context-len`` tokens per request, or twice its
context where that is longer, since the split layout follows the cache. Prints a table and writes JSON. Needs CUDA
and Triton.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from bench_kernels import graph_time_us

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(path) for path in sorted(ROOT.glob("packages/*/src"))]

from cudagraph.engine.kernels.triton.decode_attention import (  # noqa: E402
    DECODE_TILE,
    DecodeRows,
    DecodeTile,
    PagedDecodeKernel,
)
from cudagraph.engine.kv_cache import ReqToTokenPool, TokenToKVPool  # noqa: E402
from cudagraph.engine.model import model_config_from_preset  # noqa: E402

SWEEP = {"block_n": (32, 64, 128), "min_split_tokens": (64, 128, 256), "max_splits": (16, 64), "num_warps": (2, 4)}
"""The grid ``--sweep`` times (tiles whose shortest split is shorter than a block are left out)."""


@dataclass(frozen=True)
class Case:
    """``rows`` requests of ``context`` cached tokens each, decoding one token."""

    rows: int
    context: int

    @classmethod
    def parse(cls, text: str) -> Case:
        """``"8x128"``: 8 rows of 128 cached tokens."""
        rows, _, context = text.partition("x")
        return cls(int(rows), int(context))


@dataclass
class Figure:
    """One measured case: the tile, the split layout it gave, microseconds a layer."""

    rows: int
    context: int
    tile: dict[str, int]
    split_tokens: int
    splits: int
    microseconds: float


class Setup:
    """A paged cache of ``layers`` layers holding ``case.rows`` requests on scattered slots, and a query per row."""

    def __init__(self, case: Case, layers: int, heads: int, kv_heads: int, head_dim: int, max_context: int) -> None:
        device = torch.device("cuda")
        tokens = case.rows * (case.context + 1)
        self.req_pool = ReqToTokenPool(case.rows, max_context, device)
        self.kv_pool = TokenToKVPool(tokens + 16, layers, kv_heads, head_dim, torch.bfloat16, device)
        for buffer in self.kv_pool.kv_buffer:
            buffer.normal_()
        slots = self.kv_pool.alloc(tokens)
        slots = slots[torch.randperm(tokens, device=slots.device)]
        for row in range(case.rows):
            index = self.req_pool.alloc()
            self.req_pool.write(index, 0, slots[row * (case.context + 1) : (row + 1) * (case.context + 1)])
        self.req_pool_indices = torch.arange(case.rows, device=device)
        self.seq_lens = torch.full((case.rows,), case.context + 1, dtype=torch.int32, device=device)
        self.q = torch.randn(case.rows, heads * head_dim, device=device, dtype=torch.bfloat16)
        self.output = torch.empty_like(self.q)
        self.shape = (heads, kv_heads, head_dim)
        self.max_context = int(self.req_pool.req_to_token.shape[1])
        """The cache's context as the attention backend sees it (the table's width, rounded up by the pool)."""

    def time(self, tile: DecodeTile, replays: int) -> tuple[PagedDecodeKernel, float]:
        heads, kv_heads, head_dim = self.shape
        kernel = PagedDecodeKernel(heads, kv_heads, head_dim, head_dim**-0.5, self.max_context, self.q.device, tile)
        kernel.reserve(self.q.shape[0])
        launches = [
            kernel.bind(
                self.q,
                buffer,
                self.output,
                self.req_pool.req_to_token,
                DecodeRows(self.req_pool_indices, self.seq_lens),
            )
            for buffer in self.kv_pool.kv_buffer
        ]

        def step() -> None:
            for launch in launches:
                launch()

        return kernel, graph_time_us(step, repeat=1, replays=replays) / len(launches)


def sweep_tiles() -> list[DecodeTile]:
    """Every tile of ``SWEEP`` whose shortest split holds at least one block."""
    tiles = [DecodeTile(**dict(zip(SWEEP, values, strict=True))) for values in itertools.product(*SWEEP.values())]
    return [tile for tile in tiles if tile.min_split_tokens >= tile.block_n]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3-0.6b-random")
    parser.add_argument("--cases", type=Case.parse, nargs="+", default=[Case(1, 128), Case(8, 128), Case(32, 512)])
    parser.add_argument("--max-context-len", type=int, default=256)
    parser.add_argument("--sweep", action="store_true", help="time every tile of the sweep grid besides the default")
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("bench-results/bench_attention.json"))
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("the Triton decode attention kernel needs a CUDA device; nothing to benchmark")
        return 0
    config = model_config_from_preset(args.preset)
    tiles = [DECODE_TILE, *(tile for tile in sweep_tiles() if tile != DECODE_TILE)] if args.sweep else [DECODE_TILE]
    figures: list[Figure] = []
    for case in args.cases:
        max_context = max(args.max_context_len, 2 * (case.context + 1))
        setup = Setup(
            case, config.num_layers, config.num_heads, config.num_kv_heads,
            config.head_dim, max_context,
        )  # fmt: skip
        for tile in tiles:
            kernel, microseconds = setup.time(tile, args.replays)
            figures.append(
                Figure(case.rows, case.context, asdict(tile), kernel.split_tokens, kernel.splits, microseconds)
            )
        del setup
    device = torch.cuda.get_device_name()
    print(f"triton decode attention, {args.preset} (bf16), us per layer in a CUDA graph, on {device}")
    print("rows x context | block_n | min_split | max_splits | warps | split tokens x splits | us")
    for figure in figures:
        tile = figure.tile
        print(
            f"{figure.rows} x {figure.context} | {tile['block_n']} | {tile['min_split_tokens']} | {tile['max_splits']} "
            f"| {tile['num_warps']} | {figure.split_tokens} x {figure.splits} | {figure.microseconds:.2f}"
        )
    best = {}
    for case in args.cases:
        mine = [figure for figure in figures if (figure.rows, figure.context) == (case.rows, case.context)]
        fastest = min(mine, key=lambda figure: figure.microseconds)
        best[f"{case.rows}x{case.context}"] = asdict(fastest)
        print(f"fastest at {case.rows} x {case.context}: {fastest.tile} {fastest.microseconds:.2f} us")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"device": device, "preset": args.preset, "figures": [asdict(f) for f in figures], "fastest": best}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
