"""Graphs across an engine's life: start-up to first token under the eager and lazy capture policies, a bucket's
first-use capture, what sleep frees, what wake costs, and a replay after an in-place weight update (a script, not a
test).

    python3 bench/bench_lifecycle.py [--presets qwen3-0.6b llama-3-8b] [--backend full] [--max-bs 256]
        [--attention-backend triton] [--out bench-results/lifecycle.json]

Rows, per preset (random bfloat16 weights, decode graphs only, the default bucket schedule up to ``--max-bs``):

- ``startup_s``: engine built to the first decode token of one request, graphs included, per policy; the issue's
  target is lazy at most 25 % of eager (``lazy_over_eager``).
- ``first_use_capture_ms``: under lazy, the capture of one decode bucket by its first step, after the process's
  first step (``ReplayMetrics.lazy_capture_seconds`` of a step of a bucket not captured yet); target 100 ms.
- ``sleep_freed_bytes`` and ``graph_and_kv_bytes``: free memory (``torch.cuda.mem_get_info``) won by ``sleep()``
  against the graphs' and KV cache's bytes (``freed_share``, target 0.95).
- ``wake_s`` and ``wake_and_first_replay_s``: ``wake()`` (eager policy: every bucket captured again), then the same
  plus the first replayed step; the target is the latter at most the first capture.
- ``replay_us_before`` and ``replay_us_after_update``: one decode step of batch 8 replayed, before and after an
  in-place update of every weight (target: equal; ``after_over_before``), and ``recaptured`` (must be empty).

Prints one line per row with its ratios and writes the JSON. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), *(str(path) for path in sorted(ROOT.glob("packages/*/src")))]

from harness.cli import cuda_unavailable_reason  # noqa: E402
from harness.presets import BENCH_PRESETS, preset_config  # noqa: E402


@dataclass
class LifecycleRow:
    """What one preset's life measured (see the module docstring)."""

    preset: str
    backend: str
    buckets: int
    startup_s: dict[str, float] = field(default_factory=dict)
    first_use_capture_ms: float = 0.0
    first_capture_s: float = 0.0
    graph_and_kv_bytes: int = 0
    sleep_freed_bytes: int = 0
    wake_s: float = 0.0
    wake_and_first_replay_s: float = 0.0
    replay_us_before: float = 0.0
    replay_us_after_update: float = 0.0
    recaptured: list[int] = field(default_factory=list)

    @property
    def ratios(self) -> dict[str, float]:
        """The ratios the issue's targets are stated in."""
        eager, lazy = self.startup_s.get("eager", 0.0), self.startup_s.get("lazy", 0.0)
        return {
            "lazy_over_eager": lazy / eager if eager else float("nan"),
            "freed_share": self.sleep_freed_bytes / self.graph_and_kv_bytes if self.graph_and_kv_bytes else 0.0,
            "wake_over_first_capture": self.wake_and_first_replay_s / self.first_capture_s
            if self.first_capture_s
            else float("nan"),
            "after_over_before": self.replay_us_after_update / self.replay_us_before
            if self.replay_us_before
            else float("nan"),
        }


def _engine(preset: str, backend: str, max_bs: int, policy: str, attention: str, max_reqs: int):
    import torch

    from cudagraph.config import resolve
    from cudagraph.engine.model import random_model
    from cudagraph.engine.model_runner import CacheConfig, ModelRunner

    config = resolve(
        decode_cuda_graph_backend=backend,
        decode_cuda_graph_max_bs=max_bs,
        decode_cuda_graph_capture_policy=policy,
        prefill_disable_cuda_graph=True,
    )
    model = random_model(preset_config(preset), seed=0, dtype="bfloat16", device="cuda")
    torch.cuda.synchronize()
    cache = CacheConfig(max_num_reqs=max_reqs, max_context_len=256)
    return ModelRunner(model, config, cache_config=cache, attention_backend=attention)


def _first_token_seconds(preset: str, backend: str, max_bs: int, policy: str, attention: str) -> float:
    """Engine built (model loaded, not timed) to the first decode token of one request, graphs included."""
    import torch

    from cudagraph.engine.batch import SamplingParams
    from cudagraph.engine.generate import generate

    engine = _engine(preset, backend, max_bs, policy, attention, max_reqs=max_bs)
    try:
        started = time.perf_counter()
        engine.init_decode_cuda_graph()
        generate(engine, [[1, 2, 3, 4]], SamplingParams(max_new_tokens=2))
        torch.cuda.synchronize()
        return time.perf_counter() - started
    finally:
        engine.shutdown()


def _replay_us(engine, batch, steps: int = 200) -> float:
    import torch

    for _ in range(10):
        engine.run(batch)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        engine.run(batch)
    torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - started) / steps


def measure(preset: str, backend: str, max_bs: int, attention: str) -> LifecycleRow:
    """Every row of one preset (see the module docstring)."""
    import torch

    from cudagraph.engine.lifecycle import free_device_bytes
    from cudagraph.engine.testing import synthetic_decode_batch

    startup = {policy: _first_token_seconds(preset, backend, max_bs, policy, attention) for policy in ("eager", "lazy")}
    engine = _engine(preset, backend, max_bs, "lazy", attention, max_reqs=max_bs + 8)
    try:
        before = free_device_bytes(engine.device)
        runner = engine.init_decode_cuda_graph()
        assert runner is not None and before is not None
        engine.run(synthetic_decode_batch(engine, 1, 32, seed=0))  # the process's first step (bucket 1)
        spent = runner.metrics.lazy_capture_seconds
        engine.run(synthetic_decode_batch(engine, 8, 32, seed=1))  # bucket 8, captured on first use
        first_use_ms = 1000 * (runner.metrics.lazy_capture_seconds - spent)
    finally:
        engine.shutdown()

    engine = _engine(preset, backend, max_bs, "eager", attention, max_reqs=max_bs + 8)
    try:
        torch.cuda.empty_cache()  # the earlier engines' blocks, still cached, would otherwise come back during capture
        before = free_device_bytes(engine.device)
        runner = engine.init_decode_cuda_graph()
        assert runner is not None and before is not None
        first_capture_s = runner.stats.seconds
        batch = synthetic_decode_batch(engine, 8, 32, seed=2)
        replay_before = _replay_us(engine, batch)
        after = free_device_bytes(engine.device)
        assert after is not None
        kv = sum(pages.numel() * pages.element_size() for pages in engine.token_to_kv_pool.kv_pages)
        graph_and_kv = before[0] - after[0] + kv
        with torch.no_grad():
            weights = {name: param.detach() * 1.01 for name, param in engine.model.named_parameters()}
        update = engine.update_weights(weights)
        replay_after = _replay_us(engine, batch)
        levels = engine.sleep()
        started = time.perf_counter()
        engine.wake()
        torch.cuda.synchronize()
        wake_s = time.perf_counter() - started
        batch = synthetic_decode_batch(engine, 8, 32, seed=3)
        engine.run(batch)
        torch.cuda.synchronize()
        wake_and_replay_s = time.perf_counter() - started
    finally:
        engine.shutdown()
    return LifecycleRow(
        preset=preset,
        backend=backend,
        buckets=len(runner.buckets),
        startup_s=startup,
        first_use_capture_ms=first_use_ms,
        first_capture_s=first_capture_s,
        graph_and_kv_bytes=graph_and_kv,
        sleep_freed_bytes=levels.freed_by_sleep or 0,
        wake_s=wake_s,
        wake_and_first_replay_s=wake_and_replay_s,
        replay_us_before=replay_before,
        replay_us_after_update=replay_after,
        recaptured=list(update.recaptured.get("decode", ())),
    )


def main(argv: list[str] | None = None) -> int:
    """Measure, print one line per preset with its ratios, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["qwen3-0.6b"], choices=list(BENCH_PRESETS))
    parser.add_argument("--backend", choices=("full", "breakable", "tc_piecewise"), default="full")
    parser.add_argument("--max-bs", type=int, default=256)
    parser.add_argument("--attention-backend", choices=("auto", "triton", "torch", "flashinfer"), default="triton")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "lifecycle.json")
    args = parser.parse_args(argv)
    reason = cuda_unavailable_reason()
    if reason is not None:
        print(f"skipped: {reason}", file=sys.stderr)
        return 2
    rows = [measure(preset, args.backend, args.max_bs, args.attention_backend) for preset in args.presets]
    for row in rows:
        ratios = row.ratios
        print(
            f"{row.preset} ({row.backend}, {row.buckets} buckets): start-up to first token eager "
            f"{row.startup_s['eager']:.2f} s, lazy {row.startup_s['lazy']:.2f} s (lazy/eager "
            f"{ratios['lazy_over_eager']:.2f}); first-use capture {row.first_use_capture_ms:.1f} ms; sleep freed "
            f"{row.sleep_freed_bytes / 2**20:.0f} of {row.graph_and_kv_bytes / 2**20:.0f} MiB "
            f"({ratios['freed_share']:.3f}); wake {row.wake_s:.2f} s, with the first replay "
            f"{row.wake_and_first_replay_s:.2f} s (/ first capture {ratios['wake_over_first_capture']:.2f}); "
            f"replay {row.replay_us_before:.1f} us before an in-place update, {row.replay_us_after_update:.1f} us "
            f"after ({ratios['after_over_before']:.3f}), recaptured {row.recaptured or 'nothing'}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps([{**asdict(row), "ratios": row.ratios} for row in rows], indent=2))
    print(f"wrote {args.out}")
    return 0 if all(not row.recaptured for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
