"""Where a decode step replayed by a runner spends its host time (a script, not a test): build the engine the bench
builds, capture ``full``, ``breakable`` and ``tc_piecewise`` decode graphs, and for each print the replay's sequence
(segments, split calls, bound calls), the host time of the runner's replay (the batch copied in, and written in place
in its input views) and of the bare replay, the CUDA runtime calls a step makes (torch.profiler), and the top of a
cProfile of the runner's replay.

    python bench/profile_replay.py --preset qwen3-0.6b --attention-backend triton --batch-size 1
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.engine_timing import batch_in_views
from harness.workload import build_model_runner

from cudagraph.config import resolve
from cudagraph.engine.model_runner import CacheConfig
from cudagraph.engine.testing import release_synthetic_batch, synthetic_decode_batch
from cudagraph.runner import DecodeCudaGraphRunner

ROWS = {
    "full": {"decode_cuda_graph_backend": "full"},
    "breakable": {"decode_cuda_graph_backend": "breakable"},
    "tc_piecewise/eager": {"decode_cuda_graph_backend": "tc_piecewise", "tc_piecewise_compiler": "eager"},
    "tc_piecewise/inductor": {"decode_cuda_graph_backend": "tc_piecewise", "tc_piecewise_compiler": "inductor"},
}


def host_us(step: object, steps: int) -> float:
    """Median host microseconds of ``step()`` (no synchronize inside the timed call)."""
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        step()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
        torch.cuda.synchronize()
    times.sort()
    return times[len(times) // 2] * 1e6


def runtime_calls_per_step(step: object, steps: int = 50) -> dict[str, float]:
    """CUDA runtime and driver calls per ``step()`` (launches, copies, graph launches), from torch.profiler."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(steps):
            step()  # type: ignore[operator]
        torch.cuda.synchronize()
    calls = {
        event.key: event.count / steps
        for event in profile.key_averages()
        if event.key.startswith(("cuda", "cu")) and event.key != "cudaDeviceSynchronize"
    }
    return dict(sorted(calls.items(), key=lambda item: -item[1]))


def main(argv: list[str]) -> int:
    """Profile each row; print one JSON object per row and the profiles."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3-0.6b")
    parser.add_argument("--attention-backend", default="triton")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--rows", nargs="+", default=list(ROWS))
    args = parser.parse_args(argv)
    cache = CacheConfig(max_num_reqs=max(args.batch_size, 8), max_context_len=256)
    model_runner = build_model_runner(args.preset, cache, args.attention_backend)
    eager_kernels = model_runner.kernels
    for name in args.rows:
        config = resolve(**ROWS[name], decode_cuda_graph_bs=[args.batch_size], prefill_disable_cuda_graph=True)
        model_runner.use_kernels(model_runner.kernels_for(config))
        runner = DecodeCudaGraphRunner(model_runner, config, show_progress=False)
        runner.capture()
        batch = synthetic_decode_batch(model_runner, args.batch_size, 128, seed=1)
        try:
            backend = runner.backend
            entry = backend.entry(args.batch_size)
            sequence = entry.graph
            figures: dict[str, object] = {"row": name, "kernels": type(model_runner.kernels).__name__}
            if hasattr(sequence, "launches"):
                figures.update(
                    launches=sequence.launches,
                    segments=sequence.segments,
                    split_calls=len(sequence.split_calls),
                    bound=sequence.bound_split_calls,
                )
            elif hasattr(sequence, "num_segments"):
                figures.update(segments=sequence.num_segments, split_calls=sequence.num_eager_calls)
            for _ in range(20):
                runner.replay(batch)
            torch.cuda.synchronize()
            figures["runner_replay_host_us"] = round(host_us(functools.partial(runner.replay, batch), 200), 1)
            figures["bare_replay_host_us"] = round(host_us(entry.replay, 200), 1)
            in_place = batch_in_views(runner, batch)
            replay_in_place = functools.partial(runner.replay, in_place)
            figures["runner_replay_in_place_host_us"] = round(host_us(replay_in_place, 200), 1)
            # The profiler last: once it has run, CUDA calls in this process cost more host time.
            figures["runtime_calls_per_step"] = runtime_calls_per_step(functools.partial(runner.replay, batch))
            figures["in_place_runtime_calls_per_step"] = runtime_calls_per_step(replay_in_place)
            print(json.dumps(figures), flush=True)
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(200):
                runner.replay(batch)
            profiler.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(18)
            print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000], flush=True)
        finally:
            release_synthetic_batch(model_runner, batch, 128)
            runner.shutdown()
            model_runner.use_kernels(eager_kernels)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
