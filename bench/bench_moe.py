"""Decode steps of a mixture-of-experts model under each graph backend: Qwen3-30B-A3B's shapes (48 layers, 128
experts, 8 per token) with random bfloat16 weights, eager against the runner's graphs (a script, not a test).

    python3 bench/bench_moe.py [--layers 48] [--batch-sizes 1 32] [--attention-backend torch]
        [--kernel-backend auto] [--tc-piecewise-compiler eager] [--modes raw full] [--out bench-results/moe.json]

Modes, per batch size (decode steps over requests of ``--context-len`` cached tokens, all measured in this run on
the same batch): ``eager`` (the model runner's forward), ``raw`` (one ``CUDAGraph.replay`` of that forward, nothing
else), ``full``, ``breakable`` and ``tc_piecewise`` (the decode runner's replay). Ratios: ``full/raw`` (what the
runner adds to a raw replay) and ``eager/full`` (what a full graph saves), plus ``breakable/full`` and
``tc_piecewise/full``. ``--layers N`` keeps only the first N layers for a quick check (the full 48 need about 61 GB
of weights).

Prints the step table and one line of ratios per batch size, and writes the JSON (``--out``). Without CUDA only the
eager mode runs (graphs need a CUDA device): a smoke test of the script, e.g. ``--layers 1 --batch-sizes 1 --steps
2``.
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
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "moe.json")
    args = parser.parse_args(argv)
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


def main(argv: list[str] | None = None) -> int:
    """Measure every mode at every batch size, print the table and ratios, write the JSON."""
    args = parse_args(argv)
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
    }
    print(
        f"decode step, {PRESET} ({config.num_layers} layers, {', '.join(computes)} experts, bfloat16, "
        f"{args.attention_backend} attention, {engine.kernels.name} kernels) on {result['device']}"
    )
    print(format_table(bench.timings))
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


if __name__ == "__main__":
    raise SystemExit(main())
