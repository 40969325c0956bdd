"""Where capture time goes (a script, not a test): in one fresh process, one eager decode step first (as an engine
runs before it captures: what the model's first forward loads is the model's cost, not the graphs'), then per backend
a single-bucket capture first and again, and the default decode buckets first and again, printing seconds and GiB.
``--profile`` adds the top of a cProfile of each first capture (its timings then include the profiler's overhead);
``--no-eager-step`` captures before the model ever ran.

    python bench/profile_capture.py --preset qwen3-0.6b --attention-backend triton
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.workload import build_model_runner

from cudagraph.config import resolve
from cudagraph.engine.model_runner import CacheConfig
from cudagraph.engine.testing import release_synthetic_batch, synthetic_decode_batch
from cudagraph.runner import DecodeCudaGraphRunner


def profile_top(profile: cProfile.Profile, lines: int, sort: str) -> str:
    """The first ``lines`` rows of ``profile`` sorted by ``sort``."""
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats(sort).print_stats(lines)
    return out.getvalue()


def capture_once(model_runner: object, backend: str, max_bs: int, profile: bool) -> dict[str, object]:
    """Capture the default decode buckets up to ``max_bs`` with ``backend``; seconds, GiB, and the profile."""
    config = resolve(
        decode_cuda_graph_backend=backend, decode_cuda_graph_max_bs=max_bs, prefill_disable_cuda_graph=True
    )
    runner = DecodeCudaGraphRunner(model_runner, config, show_progress=False)  # type: ignore[arg-type]
    profiler = cProfile.Profile() if profile else None
    torch.cuda.synchronize()
    started = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    stats = runner.capture()
    if profiler is not None:
        profiler.disable()
    seconds = time.perf_counter() - started
    per_shape = {str(s.bucket): round(s.seconds * 1e3, 1) for s in stats.per_bucket}
    runner.shutdown()
    row: dict[str, object] = {
        "backend": backend,
        "max_bs": max_bs,
        "graphs": stats.graphs,
        "seconds": round(seconds, 3),
        "gib": round(stats.bytes / 2**30, 4),
        "ms_per_shape": per_shape,
    }
    if profiler is not None:
        row["profile_cumulative"] = profile_top(profiler, 30, "cumulative")
        row["profile_tottime"] = profile_top(profiler, 25, "tottime")
    return row


def eager_step_seconds(model_runner: Any) -> float:
    """Seconds of one eager decode step of one request (the first forward of the process)."""
    batch = synthetic_decode_batch(model_runner, 1, context_len=16, seed=0)
    torch.cuda.synchronize()
    started = time.perf_counter()
    model_runner.forward(batch)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    release_synthetic_batch(model_runner, batch, context_len=16)
    return seconds


def main(argv: list[str]) -> int:
    """Capture each backend first, then again; print JSON rows and profiles."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3-0.6b")
    parser.add_argument("--attention-backend", default="triton")
    parser.add_argument("--max-bs", type=int, default=256)
    parser.add_argument("--backends", nargs="+", default=["breakable", "full"])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--profile", action="store_true", help="cProfile each first capture (timings include it)")
    parser.add_argument("--no-eager-step", dest="eager_step", action="store_false", help="capture before any forward")
    args = parser.parse_args(argv)
    cache = CacheConfig(max_num_reqs=args.max_bs, max_context_len=512, num_kv_slots=1024)
    model_runner = build_model_runner(args.preset, cache, args.attention_backend)
    rows: list[dict[str, object]] = []
    if args.eager_step:
        rows.append({"run": "eager step before capture", "seconds": round(eager_step_seconds(model_runner), 3)})
    for backend in args.backends:
        rows.append({"run": "first, 1 bucket", **capture_once(model_runner, backend, 1, profile=args.profile)})
        rows.append({"run": "repeat, 1 bucket", **capture_once(model_runner, backend, 1, profile=False)})
        rows.append(
            {"run": "default buckets", **capture_once(model_runner, backend, args.max_bs, profile=args.profile)}
        )
        rows.append({"run": "default buckets again", **capture_once(model_runner, backend, args.max_bs, profile=False)})
    for row in rows:
        profiles = {key: row.pop(key) for key in ("profile_cumulative", "profile_tottime") if key in row}
        print(json.dumps(row))
        for name, text in profiles.items():
            print(f"--- {row['backend']} {row['run']} {name}\n{text}")
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
