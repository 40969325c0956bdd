"""Decode-step benchmark of the reference engine: eager, raw CUDAGraph.replay, and the runner (full, breakable).

On the Qwen3-0.6B-shaped preset (random bf16 weights), decode batches of 1, 8, 32 and 128 requests with 128 cached
tokens each. Also captures the default decode buckets up to 256 with each backend and reports seconds and bytes.
Prints a table with ratios to the raw replay and the issue's targets, and writes JSON (``--out``).

Host costs, measured with the device kept busy so only host work is timed: the runner's work over a raw replay
(full - raw) and the cost of one eager break ((breakable - full) / breaks), per batch size. ``--profile-host MODE``
also prints the top cProfile entries of a replay loop of that mode (``raw``, ``full``, ``breakable``,
``tc_piecewise`` with ``--tc-piecewise-compiler``) at the first batch size; ``--timeline MODE`` prints where the
device idles in back-to-back replays of that mode, by transition (kernel before -> kernel after).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from harness.engine_timing import (
    bench_capture,
    bench_decode,
    format_host_costs,
    format_table,
    measure_host_costs,
    profile_runner_replay,
    runner_replay_timeline,
)

from cudagraph.config import Backend, CudaGraphConfig, Phase, PhaseConfig, resolve
from cudagraph.engine.kernels import KERNEL_BACKEND_CHOICES
from cudagraph.engine.model import model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner

TARGETS = {
    "runner_over_raw": 1.05,
    "runner_host_us": 20.0,
    "batch1_step_ms": 1.5,
    "capture_seconds": 5.0,
    "capture_gib": 1.0,
    "runner_over_raw_host_us": 10.0,
    "per_break_host_us": 8.0,
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", "--output", dest="output", type=Path, default=Path("bench-results/bench_engine.json"))
    parser.add_argument("--preset", default="qwen3-0.6b-random")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--context-len", type=int, default=128)
    parser.add_argument("--max-context-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--capture-max-bs", type=int, default=256)
    parser.add_argument("--attention-backend", default="torch")
    parser.add_argument(
        "--kernel-backend", default="auto", choices=KERNEL_BACKEND_CHOICES, help="the layer kernel set (default auto)"
    )
    parser.add_argument("--host-repeats", type=int, default=50, help="timed calls per host-cost figure")
    parser.add_argument(
        "--profile-host",
        nargs="+",
        choices=["eager", "raw", "full", "breakable", "tc_piecewise"],
        default=[],
        help="print the top cProfile entries of a replay loop of these modes at the first batch size",
    )
    parser.add_argument(
        "--timeline",
        nargs="+",
        choices=["raw", "full", "breakable"],
        default=[],
        help="record what the device runs in back-to-back replays of these modes at the first batch size, and print "
        "where it idles, by transition (kernel before -> kernel after)",
    )
    parser.add_argument(
        "--tc-piecewise-compiler",
        choices=["eager", "inductor"],
        default="eager",
        help="the compiler of the tc_piecewise pieces that --profile-host tc_piecewise profiles",
    )
    return parser.parse_args(argv)


def write(path: Path, result: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        reason = f"CUDA graphs need a CUDA device (torch {torch.__version__} sees none); nothing to benchmark"
        print(reason)
        write(args.output, {"skipped": reason})
        return 0
    device = torch.device("cuda")
    model = random_model(model_config_from_preset(args.preset), seed=0, dtype=args.dtype, device=device)
    cache = CacheConfig(max_num_reqs=max(args.batch_sizes), max_context_len=args.max_context_len)
    # The runners under test are built per mode by bench_decode; the engine itself stays eager.
    disabled = CudaGraphConfig(PhaseConfig(Backend.DISABLED, (), 0), PhaseConfig(Backend.DISABLED, (), 0))
    model_runner = ModelRunner(
        model,
        disabled,
        cache_config=cache,
        attention_backend=args.attention_backend,
        kernel_backend=args.kernel_backend,
    )

    modes = ["eager", "raw", "full", "breakable"]
    timings = bench_decode(model_runner, args.batch_sizes, modes, context_len=args.context_len, steps=args.steps)
    capture_buckets = list(resolve(decode_cuda_graph_max_bs=args.capture_max_bs).for_phase(Phase.DECODE).buckets)
    captures = [bench_capture(model_runner, backend, capture_buckets) for backend in (Backend.FULL, Backend.BREAKABLE)]
    # For reference: the same full capture with one warm-up run per shape instead of two.
    captures.append(bench_capture(model_runner, Backend.FULL, capture_buckets, num_warmups=1))

    by_key = {(t.mode, t.batch_size): t for t in timings}
    ratios = {
        f"{mode}/raw@{bs}": by_key[(mode, bs)].step_ms / by_key[("raw", bs)].step_ms
        for mode in ("eager", "full", "breakable")
        for bs in args.batch_sizes
    }
    # Host work the runner adds on top of launching the graph: its call time minus the raw replay's.
    overhead_us = {
        f"{mode}@{bs}": by_key[(mode, bs)].host_us - by_key[("raw", bs)].host_us
        for mode in ("full", "breakable")
        for bs in args.batch_sizes
    }
    host_costs = measure_host_costs(
        model_runner, args.batch_sizes, context_len=args.context_len, repeats=args.host_repeats
    )
    profiles = {
        mode: profile_runner_replay(
            model_runner,
            mode,
            args.batch_sizes[0],
            context_len=args.context_len,
            settings=resolve(tc_piecewise_compiler=args.tc_piecewise_compiler),
        )
        for mode in args.profile_host
    }
    timelines = {
        mode: runner_replay_timeline(model_runner, mode, args.batch_sizes[0], context_len=args.context_len)
        for mode in args.timeline
    }
    batch1 = args.batch_sizes[0]
    measured = [cost for cost in host_costs if not cost.device_waited]
    checks = {
        "runner full step within 1.05x of raw replay (all batch sizes)": max(
            ratios[f"full/raw@{bs}"] for bs in args.batch_sizes
        )
        <= TARGETS["runner_over_raw"],
        "runner full host work over raw replay <= 20 us": max(overhead_us[f"full@{bs}"] for bs in args.batch_sizes)
        <= TARGETS["runner_host_us"],
        f"batch-{batch1} decode step (runner full) <= 1.5 ms": by_key[("full", batch1)].step_ms
        <= TARGETS["batch1_step_ms"],
        "capture of default decode buckets (full) <= 5 s": captures[0].seconds <= TARGETS["capture_seconds"],
        "capture of default decode buckets (full) <= 1 GiB": captures[0].bytes / 2**30 <= TARGETS["capture_gib"],
        "runner host work over raw replay, device busy, <= 10 us (all batch sizes)": bool(measured)
        and max(cost.runner_over_raw_us for cost in measured) <= TARGETS["runner_over_raw_host_us"],
        "breakable host cost per break, device busy, <= 8 us (all batch sizes)": bool(measured)
        and max(cost.per_break_us for cost in measured) <= TARGETS["per_break_host_us"],
    }
    result = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "preset": args.preset,
        "dtype": args.dtype,
        "attention_backend": args.attention_backend,
        "kernel_backend": model_runner.kernels.name,
        "context_len": args.context_len,
        "max_context_len": args.max_context_len,
        "timings": [t.as_dict() for t in timings],
        "ratios": ratios,
        "runner_host_overhead_us": overhead_us,
        "captures": [c.as_dict() for c in captures],
        "host_costs": [cost.as_dict() for cost in host_costs],
        "host_profiles": profiles,
        "device_timelines": {mode: timeline.as_dict() for mode, timeline in timelines.items()},
        "targets": TARGETS,
        "checks": checks,
    }
    print(
        f"decode step, {args.preset} ({args.dtype}, {args.attention_backend} attention, "
        f"{model_runner.kernels.name} kernels) on {result['device']}"
    )
    print(format_table(timings))
    print("runner host work over raw replay (us): " + ", ".join(f"{k} {v:.1f}" for k, v in overhead_us.items()))
    print("host cost with the device busy (median us per step):")
    print(format_host_costs(host_costs))
    for mode, profile in profiles.items():
        print(f"cProfile of 200 {mode} replays at batch {batch1} (top entries by own time):")
        print(profile)
    for mode, timeline in timelines.items():
        print(f"device timeline of {mode} replays at batch {batch1}:")
        print(timeline.format())
    for capture in captures:
        print(
            f"capture {capture.backend} ({capture.num_warmups} warm-ups per shape): {len(capture.buckets)} buckets up "
            f"to {max(capture.buckets)} in {capture.seconds:.2f} s, {capture.bytes / 2**30:.3f} GiB"
        )
    for name, passed in checks.items():
        print(f"{'PASS' if passed else 'MISS'}  {name}")
    write(args.output, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
