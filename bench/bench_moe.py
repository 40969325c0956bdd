"""Decode steps of a mixture-of-experts model under each graph backend: Qwen3-30B-A3B's shapes (48 layers, 128
experts, 8 per token) with random bfloat16 weights, eager against the runner's graphs (a script, not a test).

    python3 bench/bench_moe.py [--layers 48] [--batch-sizes 1 32] [--attention-backend torch]
        [--kernel-backend auto] [--tc-piecewise-compiler eager] [--modes raw full] [--out bench-results/moe.json]
    python3 bench/bench_moe.py --sweep-crossover [--sweep-tokens 1 2 4 ...] [--out bench-results/moe-crossover.json]

Modes, per batch size (decode steps over requests of ``--context-len`` cached tokens, all measured in this run on
the same batch): ``eager`` (the model runner's forward), ``raw`` (one ``CUDAGraph.replay`` of that forward, nothing
else), ``full``, ``breakable`` and ``tc_piecewise`` (the decode runner's replay). Ratios: ``full/raw`` (what the
runner adds to a raw replay) and ``eager/full`` (what a full graph saves), plus ``breakable/full`` and
``tc_piecewise/full``. ``--layers N`` keeps only the first N layers for a quick check (the full 48 need about 61 GB
of weights).

Prints the step table and one line of ratios per batch size, and writes the JSON (``--out``). On CUDA it also prints
the active-weight floor of a batch-1 step (the bytes one token reads: every weight but the experts and the embedding
table, one embedding row, and ``top_k`` experts a layer, over the device's copy bandwidth) and each mode's step over
it (``full/floor``). Without CUDA only the eager mode runs (graphs need a CUDA device): a smoke test of the script,
e.g. ``--layers 1 --batch-sizes 1 --steps 2``.

``--sweep-crossover`` times one MoE layer's experts alone instead (Qwen3-30B-A3B's expert shapes, bfloat16, a random
routing per token count): the Triton GEMV kernels (``kernels.triton.moe``) against the wide computation the model
takes above ``MOE_GEMV_MAX_TOKENS`` (``grouped_mm`` on an H100/H200), each inside a CUDA graph cycling over
``--sweep-layers`` layers' weights (so no layer's experts stay in L2), beside the floor of the distinct experts the
routing touches. It prints one row per token count and the crossover: the largest swept count up to which the GEMV
kernels win at every count, the value for ``MOE_GEMV_MAX_TOKENS``. With ``--sweep-tiles`` it also times each kernel's
other tiles at one token (the other kernel on its ``MOE_TILES`` tile) and prints the fastest of each.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), *(str(path) for path in sorted(ROOT.glob("packages/*/src")))]

from harness.cli import cuda_unavailable_reason  # noqa: E402

PRESET = "qwen3-30b-a3b-random"
GRAPH_MODES = ("raw", "full", "breakable", "tc_piecewise")
RATIOS = (("full", "raw"), ("eager", "full"), ("breakable", "full"), ("tc_piecewise", "full"))
"""Each ratio is the first mode's step time over the second's, at one batch size."""
SWEEP_TOKENS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
"""Token counts ``--sweep-crossover`` times by default."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=48, help="keep the first N decoder layers (default: all 48)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--context-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=50, help="timed steps per mode and batch size")
    parser.add_argument("--attention-backend", default="torch")
    parser.add_argument("--kernel-backend", default="auto", help="the layer kernel set (default auto)")
    parser.add_argument("--tc-piecewise-compiler", choices=("eager", "inductor"), default="eager")
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=GRAPH_MODES,
        default=list(GRAPH_MODES),
        help="the graphed modes to measure (default: all; eager always runs, the reference of every ratio)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the JSON (default bench-results/moe.json, or bench-results/moe-crossover.json with --sweep-crossover)",
    )
    parser.add_argument(
        "--sweep-crossover", action="store_true", help="time one layer's experts: GEMV kernels against the wide path"
    )
    parser.add_argument("--sweep-tokens", type=int, nargs="+", default=list(SWEEP_TOKENS))
    parser.add_argument("--sweep-layers", type=int, default=4, help="layers' weights a swept graph cycles over")
    parser.add_argument(
        "--sweep-tiles",
        action="store_true",
        help="with --sweep-crossover: time each kernel's other tiles at 1 token",
    )
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = ROOT / "bench-results" / ("moe-crossover.json" if args.sweep_crossover else "moe.json")
    if args.layers < 1:
        parser.error(f"--layers must be at least 1, got {args.layers}")
    return args


def build_engine(args: argparse.Namespace, device: str):
    """The model runner (its own graphs disabled: each graphed mode gets a decode runner of its own)."""
    from cudagraph.config import resolve
    from cudagraph.engine.model import model_config_from_preset, random_model
    from cudagraph.engine.model_runner import CacheConfig, ModelRunner

    config = model_config_from_preset(PRESET)
    config = config.with_overrides(num_layers=min(args.layers, config.num_layers))
    model = random_model(config, seed=0, dtype="bfloat16", device=device)
    settings = resolve(
        decode_disable_cuda_graph=True,
        prefill_disable_cuda_graph=True,
        tc_piecewise_compiler=args.tc_piecewise_compiler,
    )
    cache = CacheConfig(max_num_reqs=max(args.batch_sizes), max_context_len=args.context_len + 8)
    return ModelRunner(
        model,
        settings,
        cache_config=cache,
        attention_backend=args.attention_backend,
        kernel_backend=args.kernel_backend,
    )


def ratios_of(timings: list, batch_sizes: list[int]) -> dict[str, float]:
    """``"A/B@bs"``: mode A's step time over mode B's at batch size bs, for every pair in ``RATIOS`` both measured."""
    by_key = {(timing.mode, timing.batch_size): timing.step_ms for timing in timings}
    return {
        f"{over}/{under}@{bs}": by_key[(over, bs)] / by_key[(under, bs)]
        for bs in batch_sizes
        for over, under in RATIOS
        if (over, bs) in by_key and (under, bs) in by_key
    }


def active_floor_ms(model) -> float:
    """The active-weight floor of a batch-1 decode step of ``model``: the bytes one token reads over the device's
    copy bandwidth. Every weight is read but the experts (``top_k`` of each layer's) and the embedding table (one row;
    all of it where the LM head is the same tensor)."""
    from harness.timing import copy_bandwidth_bytes_per_second, weight_bytes

    from cudagraph.engine.model.moe import SparseMoE

    total = weight_bytes(model)
    for block in (module for module in model.modules() if isinstance(module, SparseMoE)):
        per_expert = sum(w[0].numel() * w.element_size() for w in (block.gate_up_weight, block.down_weight))
        total -= per_expert * (block.gate_up_weight.shape[0] - block.top_k)
    embedding = model.embed_tokens
    if embedding.data_ptr() != model.lm_head.data_ptr():
        total -= (embedding.shape[0] - 1) * embedding.shape[1] * embedding.element_size()
    return total / copy_bandwidth_bytes_per_second() * 1e3


def over_floor(timings: list, floor_ms: float | None) -> dict[str, float]:
    """Each mode's batch-1 step over the active-weight floor."""
    if floor_ms is None:
        return {}
    return {timing.mode: timing.step_ms / floor_ms for timing in timings if timing.batch_size == 1}


def main(argv: list[str] | None = None) -> int:
    """Measure every mode at every batch size, print the table and ratios, write the JSON (or, with
    ``--sweep-crossover``, the experts' crossover sweep)."""
    args = parse_args(argv)
    if args.sweep_crossover:
        return sweep_crossover(args)
    import torch
    from harness.engine_timing import format_table, run_decode_bench

    from cudagraph.engine.model.moe import SparseMoE

    reason = cuda_unavailable_reason()
    device = "cpu" if reason else "cuda"
    modes = ["eager"] if reason else ["eager", *(mode for mode in GRAPH_MODES if mode in args.modes)]
    if reason:
        print(f"eager only: {reason}", file=sys.stderr)
    engine = build_engine(args, device)
    try:
        bench = run_decode_bench(engine, args.batch_sizes, modes, context_len=args.context_len, steps=args.steps)
    finally:
        engine.shutdown()
    config = engine.model.config
    floor_ms = active_floor_ms(engine.model) if device == "cuda" else None
    computes = sorted({m.expert_compute.name for m in engine.model.modules() if isinstance(m, SparseMoE)})
    ratios = ratios_of(bench.timings, args.batch_sizes)
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "preset": PRESET,
        "layers": config.num_layers,
        "experts": config.num_experts,
        "experts_per_token": config.num_experts_per_tok,
        "expert_compute": computes,
        "dtype": "bfloat16",
        "attention_backend": args.attention_backend,
        "kernel_backend": engine.kernels.name,
        "tc_piecewise_compiler": args.tc_piecewise_compiler,
        "context_len": args.context_len,
        "timings": [timing.as_dict() for timing in bench.timings],
        "captures": [capture.as_dict() for capture in bench.captures],
        "graphs_off": bench.graphs_off,
        "ratios": ratios,
        "active_weight_floor_ms@1": floor_ms,
        "over_floor@1": over_floor(bench.timings, floor_ms),
    }
    print(
        f"decode step, {PRESET} ({config.num_layers} layers, {', '.join(computes)} experts, bfloat16, "
        f"{args.attention_backend} attention, {engine.kernels.name} kernels) on {result['device']}"
    )
    print(format_table(bench.timings))
    if floor_ms is not None:
        line = ", ".join(f"{mode}/floor {ratio:.2f}" for mode, ratio in result["over_floor@1"].items())
        print(f"batch 1: active-weight floor {floor_ms:.3f} ms; {line or 'batch 1 not timed'}")
    for mode, why in bench.graphs_off.items():
        print(f"{mode}: not timed, its graphs are off: {why}")
    for bs in args.batch_sizes:
        line = ", ".join(f"{key.split('@')[0]} {value:.3f}" for key, value in ratios.items() if key.endswith(f"@{bs}"))
        print(f"batch {bs}: {line or 'no ratios (graph modes need CUDA)'}")
    for capture in bench.captures:
        print(
            f"capture {capture.backend}: {capture.buckets} in {capture.seconds:.2f} s, {capture.bytes / 2**30:.3f} GiB"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def expert_layers(count: int, seed: int):
    """``count`` layers' expert weights at Qwen3-30B-A3B's shapes, bfloat16, on CUDA: ``(gate_up, down)`` pairs."""
    import torch

    from cudagraph.engine.model import model_config_from_preset

    config = model_config_from_preset(PRESET)
    experts, width, hidden = config.num_experts, config.moe_intermediate_size, config.hidden_size
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def draw(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=generator, device="cuda") / shape[-1] ** 0.5).to(torch.bfloat16)

    return config, [(draw(experts, 2 * width, hidden), draw(experts, hidden, width)) for _ in range(count)]


def sweep_crossover(args: argparse.Namespace) -> int:
    """Time one layer's experts at each of ``--sweep-tokens``: the GEMV kernels, the wide path, and the floor of the
    distinct experts touched; print the rows and the crossover, write the JSON."""
    reason = cuda_unavailable_reason()
    if reason:
        print(f"--sweep-crossover needs CUDA: {reason}", file=sys.stderr)
        return 2
    import torch
    from bench_kernels import graph_time_us
    from harness.timing import copy_bandwidth_bytes_per_second

    from cudagraph.engine.kernels.triton import moe as triton_moe
    from cudagraph.engine.model.moe import route, wide_experts

    bandwidth = copy_bandwidth_bytes_per_second()
    config, layers = expert_layers(args.sweep_layers, seed=0)
    expert_bytes = sum(w[0].numel() * w.element_size() for w in layers[0])
    rows = []
    for tokens in args.sweep_tokens:
        generator = torch.Generator(device="cuda").manual_seed(tokens)
        x = torch.randn(tokens, config.hidden_size, generator=generator, device="cuda").to(torch.bfloat16)
        logits = torch.randn(tokens, config.num_experts, generator=generator, device="cuda")
        routing = route(logits, config.num_experts_per_tok, config.norm_topk_prob)
        touched = int(routing.experts.unique().numel())  # off the clock: the floor's byte count

        def gemv(x=x, routing=routing) -> None:
            for gate_up, down in layers:
                triton_moe.moe_experts(x, routing.weights, routing.experts, gate_up, down, 0)

        def wide(x=x, routing=routing) -> None:
            for gate_up, down in layers:
                wide_experts(x, routing, gate_up, down, 0)

        gemv_us = graph_time_us(gemv, 1, 50) / len(layers)
        wide_us = graph_time_us(wide, 1, 50) / len(layers)
        floor_us = touched * expert_bytes / bandwidth * 1e6
        rows.append({"tokens": tokens, "experts_touched": touched, "gemv_us": gemv_us, "wide_us": wide_us,
                     "floor_us": floor_us})  # fmt: skip
        print(
            f"tokens {tokens:>4}: {touched:>3} experts touched, floor {floor_us:7.1f} us | gemv {gemv_us:7.1f} us "
            f"({gemv_us / floor_us:.2f}x floor) | wide {wide_us:7.1f} us ({wide_us / floor_us:.2f}x) | "
            f"{'gemv' if gemv_us <= wide_us else 'wide'} wins"
        )
    crossover = crossover_of(rows)
    tiles = sweep_tiles(layers, config) if args.sweep_tiles else []
    print(
        f"crossover: GEMV kernels win up to {crossover} tokens (MOE_GEMV_MAX_TOKENS is "
        f"{triton_moe.MOE_GEMV_MAX_TOKENS})"
    )
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "preset": PRESET,
        "dtype": "bfloat16",
        "wide_compute": "grouped_mm" if torch.cuda.get_device_capability()[0] in (9, 10) else "dense",
        "copy_bandwidth_gb_per_s": bandwidth / 1e9,
        "layers_cycled": len(layers),
        "rows": rows,
        "crossover_tokens": crossover,
        "moe_gemv_max_tokens": triton_moe.MOE_GEMV_MAX_TOKENS,
        "tiles_at_one_token": tiles,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


SWEEP_TILE_SHAPES = {
    "gate_up": [(block_n, block_k) for block_n in (2, 4, 8) for block_k in (512, 1024, 2048)],
    "down": [(block_n, block_k) for block_n in (2, 4, 8) for block_k in (256, 512, 1024)],
}
"""(block_n, block_k) of each kernel that ``--sweep-tiles`` times (4 warps each, and 8 for the table's shape)."""


def sweep_tiles(layers: list, config) -> list[dict]:
    """Time the GEMV kernels at one token over ``layers`` with each kernel's swept tiles (the other kernel on its
    table tile); print every figure and the fastest tile of each kernel."""
    import dataclasses

    import torch
    from bench_kernels import graph_time_us

    from cudagraph.engine.kernels.triton import moe as triton_moe
    from cudagraph.engine.model.moe import route

    generator = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(1, config.hidden_size, generator=generator, device="cuda").to(torch.bfloat16)
    logits = torch.randn(1, config.num_experts, generator=generator, device="cuda")
    routing = route(logits, config.num_experts_per_tok, config.norm_topk_prob)
    figures = []
    for kernel, shapes in SWEEP_TILE_SHAPES.items():
        table = getattr(triton_moe.MOE_TILES, kernel)
        candidates = [triton_moe.MoeTile(n, k) for n, k in shapes] + [dataclasses.replace(table, num_warps=8)]
        for tile in candidates:
            tiles = dataclasses.replace(triton_moe.MOE_TILES, **{kernel: tile})

            def launch(tiles=tiles) -> None:
                for gate_up, down in layers:
                    triton_moe.moe_experts(x, routing.weights, routing.experts, gate_up, down, 0, tiles=tiles)

            time_us = graph_time_us(launch, 1, 50) / len(layers)
            figures.append({"kernel": kernel, **dataclasses.asdict(tile), "us": time_us, "table": tile == table})
            print(f"tile {kernel} {tile}: {time_us:7.1f} us{' (table)' if tile == table else ''}")
    for kernel in SWEEP_TILE_SHAPES:
        best = min((figure for figure in figures if figure["kernel"] == kernel), key=lambda figure: figure["us"])
        print(f"fastest {kernel} tile at one token: {best}")
    return figures


def crossover_of(rows: list[dict]) -> int:
    """The largest token count up to which the GEMV kernels are at least as fast as the wide path at every swept
    count (0 where the wide path wins at the smallest)."""
    crossover = 0
    for row in sorted(rows, key=lambda row: row["tokens"]):
        if row["gemv_us"] > row["wide_us"]:
            break
        crossover = row["tokens"]
    return crossover


if __name__ == "__main__":
    raise SystemExit(main())
