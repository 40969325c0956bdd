"""LoRA under CUDA graphs: the cost of a decode step with adapters against the same step without, and the graph
memory of both variants against the plain graphs alone (a script, not a test).

    python3 bench/bench_lora.py [--preset llama-3-8b] [--backend full] [--max-bs 64] [--adapters 8] [--rank 16]
        [--attention-backend triton] [--out bench-results/lora.json]
    python3 bench/bench_lora.py --device cpu --preset tiny-llama --steps 3   # smoke: eager steps, no graphs

One engine, random bfloat16 weights, decode graphs only (the default bucket schedule up to ``--max-bs``), with
``--adapters`` adapters of rank ``--rank`` on q/k/v/o loaded (``LoraConfig(max_loras=adapters, max_rank=rank)``).
A batch of ``--batch`` requests (each with a 32-token prompt, prefilled eagerly) decodes:

- ``lora_step_us``: the batch with a mix of adapters (request ``i`` through adapter ``i % adapters``, every fourth
  through none), replaying the LoRA variant; ``plain_step_us``: the same prompts without adapters, replaying the
  plain graphs. ``lora_over_plain``: target at most 1.15.
- ``plain_graph_bytes`` and ``lora_graph_bytes``: free device memory each variant's capture took
  (``CaptureStats.bytes``; the LoRA variant captured second, into the same shared pool). ``graph_bytes_ratio`` is
  both over the plain graphs alone: target at most 1.2. ``adapter_slot_bytes`` (the slots and the index buffer,
  allocated with the engine, not graph memory) is reported beside it.
- ``replays``: ``ModelRunner.cuda_graph_variant_replays`` after the timed steps (each variant must have replayed).

Prints one line with its ratios and writes the JSON. On ``--device cpu`` steps run eagerly (no graph bytes): a
smoke of the script only.
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

SMOKE_PRESETS = {"tiny-llama": "tiny-llama-random"}
"""Engine presets small enough for the CPU smoke."""
STEP_TARGET, MEMORY_TARGET = 1.15, 1.2
PROMPT_LEN = 32


@dataclass
class LoraRow:
    """What one run measured (see the module docstring)."""

    preset: str
    backend: str
    device: str
    batch: int
    adapters: int
    rank: int
    buckets: int = 0
    plain_step_us: float = 0.0
    lora_step_us: float = 0.0
    plain_graph_bytes: int = 0
    lora_graph_bytes: int = 0
    adapter_slot_bytes: int = 0
    replays: dict[str, int] = field(default_factory=dict)

    @property
    def ratios(self) -> dict[str, float]:
        """The ratios the targets are stated in."""
        plain_bytes = self.plain_graph_bytes
        return {
            "lora_over_plain": self.lora_step_us / self.plain_step_us if self.plain_step_us else float("nan"),
            "graph_bytes_ratio": (plain_bytes + self.lora_graph_bytes) / plain_bytes if plain_bytes else float("nan"),
        }


def _model_config(preset: str):
    from cudagraph.engine.model import model_config_from_preset

    return model_config_from_preset(SMOKE_PRESETS[preset]) if preset in SMOKE_PRESETS else preset_config(preset)


def _engine(args: argparse.Namespace):
    import torch

    from cudagraph.config import resolve
    from cudagraph.engine.lora import LoraConfig
    from cudagraph.engine.model import random_model
    from cudagraph.engine.model_runner import CacheConfig, ModelRunner

    config = resolve(
        decode_cuda_graph_backend=args.backend, decode_cuda_graph_max_bs=args.max_bs, prefill_disable_cuda_graph=True
    )
    model = random_model(_model_config(args.preset), seed=0, dtype="bfloat16", device=args.device)
    if args.device == "cuda":
        torch.cuda.synchronize()
    cache = CacheConfig(max_num_reqs=2 * args.batch + 2, max_context_len=PROMPT_LEN + args.steps + 32)
    lora = LoraConfig(max_loras=args.adapters, max_rank=args.rank)
    return ModelRunner(model, config, cache_config=cache, attention_backend=args.attention_backend, lora_config=lora)


def _load_adapters(engine, count: int, rank: int) -> list[str]:
    """``count`` random adapters of ``rank`` on every layer's q/k/v/o, loaded in place."""
    import torch

    from cudagraph.engine.lora import LORA_TARGETS, LoraAdapter

    config = engine.model.local_config
    generator = torch.Generator().manual_seed(7)
    names = []
    for index in range(count):
        factors = {}
        for layer in range(len(engine.model.layers)):
            for name, target in LORA_TARGETS.items():
                a = torch.randn((rank, target.in_features(config)), generator=generator) * 0.01
                b = torch.randn((target.out_features(config), rank), generator=generator) * 0.01
                factors[(layer, name)] = (a.to(engine.device, engine.dtype), b.to(engine.device, engine.dtype))
        names.append(f"adapter-{index}")
        engine.load_lora_adapter(names[-1], LoraAdapter.from_tensors(factors, alpha=2 * rank))
    return names


def _prefilled(engine, names: list[str | None], seed: int):
    """Requests of ``PROMPT_LEN``-token prompts through ``names``, prefilled (their first token sampled)."""
    import torch

    from cudagraph.engine.batch import Request, SamplingParams

    generator = torch.Generator().manual_seed(seed)
    vocab = engine.model.config.vocab_size
    requests = []
    for index, name in enumerate(names):
        prompt = torch.randint(0, vocab, (PROMPT_LEN,), generator=generator).tolist()
        params = SamplingParams(max_new_tokens=PROMPT_LEN, lora_name=name)
        requests.append(engine.hold(Request(index, prompt, params)))
    first = engine.run(engine.extend_batch(requests)).argmax(-1).tolist()
    for request, token in zip(requests, first, strict=True):
        request.cached_len = len(request.prompt_ids)
        request.output_ids.append(token)
    return requests


def _step_us(engine, requests, steps: int) -> float:
    """One decode step of ``requests`` (the same batch each time), in microseconds."""
    import torch

    batch = engine.decode_batch(requests)
    sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
    for _ in range(min(10, steps)):
        engine.run(batch)
    sync()
    started = time.perf_counter()
    for _ in range(steps):
        engine.run(batch)
    sync()
    return 1e6 * (time.perf_counter() - started) / steps


def measure(args: argparse.Namespace) -> LoraRow:
    """Every row (see the module docstring)."""
    import torch

    from cudagraph.config import Phase

    engine = _engine(args)
    row = LoraRow(args.preset, args.backend, args.device, args.batch, args.adapters, args.rank)
    try:
        if args.device == "cuda":
            torch.cuda.empty_cache()
        engine.init_decode_cuda_graph()
        for lora, attribute in ((False, "plain_graph_bytes"), (True, "lora_graph_bytes")):
            runner = engine.lora_decode_cuda_graph_runner if lora else engine.decode_cuda_graph_runner
            if runner is not None:
                setattr(row, attribute, runner.stats.bytes)
                row.buckets = len(runner.captured_buckets)
        assert engine.lora is not None
        row.adapter_slot_bytes = sum(t.numel() * t.element_size() for t in engine.lora.named_tensors().values())
        names = _load_adapters(engine, args.adapters, args.rank)
        mix: list[str | None] = [None if i % 4 == 3 else names[i % len(names)] for i in range(args.batch)]
        with_adapters = _prefilled(engine, mix, seed=1)
        without = _prefilled(engine, [None] * args.batch, seed=1)
        row.plain_step_us = _step_us(engine, without, args.steps)
        row.lora_step_us = _step_us(engine, with_adapters, args.steps)
        row.replays = engine.cuda_graph_variant_replays
        assert engine.lora_cuda_graph_metrics[Phase.DECODE].steps > 0
    finally:
        engine.shutdown()
    return row


def main(argv: list[str] | None = None) -> int:
    """Measure, print one line with the ratios, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="llama-3-8b", choices=[*BENCH_PRESETS, *SMOKE_PRESETS])
    parser.add_argument("--backend", choices=("full", "breakable", "tc_piecewise"), default="full")
    parser.add_argument("--max-bs", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--attention-backend", choices=("auto", "triton", "torch", "flashinfer"), default="triton")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "lora.json")
    args = parser.parse_args(argv)
    if args.device == "cpu":
        args.attention_backend = "torch"
    else:
        reason = cuda_unavailable_reason()
        if reason is not None:
            print(f"skipped: {reason}", file=sys.stderr)
            return 2
    row = measure(args)
    ratios = row.ratios
    print(
        f"{row.preset} ({row.backend}, {row.device}, {row.buckets} buckets, batch {row.batch}, {row.adapters} adapters "
        f"of rank {row.rank}): decode step {row.plain_step_us:.1f} us without LoRA, {row.lora_step_us:.1f} us with "
        f"(lora/plain {ratios['lora_over_plain']:.3f}, target <= {STEP_TARGET}); graph memory "
        f"{row.plain_graph_bytes / 2**20:.1f} MiB plain + {row.lora_graph_bytes / 2**20:.1f} MiB LoRA variant "
        f"(both/plain {ratios['graph_bytes_ratio']:.3f}, target <= {MEMORY_TARGET}); adapter slots "
        f"{row.adapter_slot_bytes / 2**20:.1f} MiB; replays {row.replays}"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**asdict(row), "ratios": ratios}, indent=2))
    print(f"wrote {args.out}")
    graphed = row.device == "cpu" or (row.replays.get("decode", 0) > 0 and row.replays.get("decode lora", 0) > 0)
    return 0 if graphed else 1


if __name__ == "__main__":
    raise SystemExit(main())
