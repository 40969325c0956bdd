"""LoRA under CUDA graphs: the cost of a decode step with adapters against the same step without, and the graph
memory of both variants against the plain graphs alone (a script, not a test).

    python3 bench/bench_lora.py [--preset llama-3-8b] [--backend full] [--max-bs 64] [--adapters 8] [--rank 16]
        [--attention-backend triton] [--out bench-results/lora.json]
    python3 bench/bench_lora.py --device cpu --preset tiny-llama --steps 3   # smoke: eager steps, no graphs
    python3 bench/bench_lora.py --kernels [--sweep] [--preset llama-3-8b] [--batch 8]
        [--out bench-results/lora_kernels.json]

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
- ``lora_kernels``: which delta ran, from the engine's kernel set (``LayerKernels.lora_delta``): the Triton set's
  two fused kernels, or the torch reference's three a projection.

``--kernels`` times the delta alone instead: per projection (q/k/v, o), the torch reference (``add_lora_delta``:
``mm``, ``mul_``, ``addmm_``) and the fused kernels (``kernels.triton.lora``), each as one CUDA graph of every
layer's delta of that projection at the preset's shapes and ``--batch`` tokens (slots filled with random factors,
tokens through every slot and none), replayed ``--steps`` times: ``per_layer_us`` per projection and path, and the
sum over a step's layers. On ``--device cpu`` the paths run eagerly (the fused one under ``TRITON_INTERPRET=1``
only): a smoke of the script. ``--kernels --sweep`` also times the fused delta over every tile of ``sweep_tiles``
(split of the reduction, shrink columns and reduction step, expand rows) at ``--batch`` tokens, per projection, and
reports the fastest beside the tile ``kernels.triton.lora.LORA_TILES`` picks (``sweep``): how that table is chosen.

Prints one line with its ratios and writes the JSON. On ``--device cpu`` steps run eagerly (no graph bytes): a
smoke of the script only.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
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
DEFAULT_OUT = ROOT / "bench-results" / "lora.json"


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
    lora_kernels: str = ""

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
    from harness.timing import mean_wall_us

    batch = engine.decode_batch(requests)
    return mean_wall_us(functools.partial(engine.run, batch), steps, min(10, steps), engine.device.type == "cuda")


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
        row.lora_kernels = delta_kernels(engine.kernels)
        assert engine.lora_cuda_graph_metrics[Phase.DECODE].steps > 0
    finally:
        engine.shutdown()
    return row


DELTA_KERNELS = {
    "torch": "torch add_lora_delta (mm, mul_, addmm_)",
    "fused": "triton lora_delta (_lora_shrink_kernel, _lora_expand_kernel)",
}
"""What each delta path launches per projection."""


def delta_kernels(kernels) -> str:
    """The delta a model on kernel set ``kernels`` computes (its ``lora_delta``, else the torch reference)."""
    return f"{kernels.name}: {DELTA_KERNELS['torch' if kernels.lora_delta is None else 'fused']}"


@dataclass
class DeltaRow:
    """What ``--kernels`` measured: per projection and path, one layer's delta in microseconds."""

    preset: str
    device: str
    tokens: int
    adapters: int
    rank: int
    layers: int
    per_layer_us: dict[str, dict[str, float]] = field(default_factory=dict)
    per_step_us: dict[str, float] = field(default_factory=dict)
    kernels: dict[str, str] = field(default_factory=lambda: dict(DELTA_KERNELS))
    sweep: dict[str, list[dict[str, object]]] = field(default_factory=dict)
    """With ``--sweep``, per projection: every tile timed (fastest first), each ``{"tile": ..., "per_layer_us":
    ..., "table": whether it is the tile the table picks}``."""


SWEEP_SPLITS = (1, 2, 4, 8, 16)
SWEEP_BLOCK_K = (64, 128, 256)
SWEEP_SHRINK_N = (16, 32)
SWEEP_EXPAND_N = (16, 32, 64, 128)
"""The tile fields ``--sweep`` varies: the reduction's split, its step, the shrink's columns and the expand's rows a
program (``block_t`` stays 16: ``tl.dot``'s least, and decode steps are few tokens)."""


def sweep_tiles(tokens: int):
    """Every tile of the sweep for a step of ``tokens`` tokens (``kernels.triton.lora.LoraTile``)."""
    import itertools

    from cudagraph.engine.kernels.triton.lora import LoraTile

    return [
        LoraTile(tokens, 16, shrink_n, block_k, split, expand_n)
        for split, block_k, shrink_n, expand_n in itertools.product(
            SWEEP_SPLITS, SWEEP_BLOCK_K, SWEEP_SHRINK_N, SWEEP_EXPAND_N
        )
    ]


def _delta_inputs(args: argparse.Namespace):
    """Every layer's slot tensors at the preset's shapes, filled with random factors, and a step's inputs."""
    import torch

    from cudagraph.engine.lora import AdapterSlots, LoraConfig, LoraStep

    config = _model_config(args.preset)
    device, dtype = torch.device(args.device), torch.bfloat16 if args.device == "cuda" else torch.float32
    slots = AdapterSlots(
        LoraConfig(max_loras=args.adapters, max_rank=args.rank), config, config.num_layers, dtype, device
    )
    generator = torch.Generator(device).manual_seed(0)
    for layer in slots.projections:
        for projection in layer.values():
            projection.a.copy_(0.01 * torch.randn(projection.a.shape, generator=generator, device=device))
            for index in range(len(projection.targets)):
                view = projection.target_b(index)
                view.copy_(0.01 * torch.randn(view.shape, generator=generator, device=device))
    for slot in range(args.adapters):  # every slot scaled by 2 over its ranks (as a loaded adapter of alpha 2 * rank)
        slots.scale_table[slot, slot * args.rank : (slot + 1) * args.rank] = 2.0
    step = LoraStep(args.batch, slots.scale_table)
    step.write([index % (args.adapters + 1) for index in range(args.batch)])
    step.gather_scales(args.batch)
    return config, slots, step.scales


def measure_deltas(args: argparse.Namespace) -> DeltaRow:
    """``--kernels`` (see the module docstring)."""
    import torch

    from cudagraph.engine.kernels.triton.lora import lora_delta
    from cudagraph.engine.lora import add_lora_delta

    config, slots, scales = _delta_inputs(args)
    row = DeltaRow(args.preset, args.device, args.batch, args.adapters, args.rank, config.num_layers)
    cuda = args.device == "cuda"
    generator = torch.Generator(args.device).manual_seed(1)
    widths = {"qkv": (config.hidden_size, config.q_size + 2 * config.kv_size), "o": (config.q_size, config.hidden_size)}
    paths = {
        "torch": lambda out, x, projection: add_lora_delta(out, x, projection, scales),
        "fused": lambda out, x, projection: lora_delta(out, x, projection.a, projection.b, scales, projection.rows),
    }
    if not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        del paths["fused"]  # Triton's kernels run on CPU tensors only under its interpreter
    for name, (in_features, out_features) in widths.items():
        x = torch.randn((args.batch, in_features), generator=generator, device=args.device).to(scales.dtype)
        out = torch.zeros((args.batch, out_features), dtype=scales.dtype, device=args.device)
        layers = [layer[name] for layer in slots.projections if name in layer]
        row.per_layer_us[name] = {}
        for path, delta in paths.items():
            every_layer = functools.partial(_every_layer, delta, out, x, layers)
            row.per_layer_us[name][path] = _replay_us(every_layer, args.steps, cuda) / len(layers)
        if args.sweep and "fused" in paths:
            row.sweep[name] = _sweep(args, scales, out, x, layers, cuda)
    for path in paths:
        row.per_step_us[path] = sum(row.layers * times[path] for times in row.per_layer_us.values())
    return row


def _sweep(args: argparse.Namespace, scales, out, x, layers, cuda: bool) -> list[dict[str, object]]:
    """The fused delta of every layer timed over each tile of the sweep, fastest first."""
    from cudagraph.engine.kernels.triton.lora import lora_delta, lora_tile

    table_tile = asdict(lora_tile(args.batch)) | {"max_tokens": args.batch}
    timed = []
    for tile in sweep_tiles(args.batch):

        def delta(out, x, projection, tile=tile) -> None:
            lora_delta(out, x, projection.a, projection.b, scales, projection.rows, tile)

        every_layer = functools.partial(_every_layer, delta, out, x, layers)
        per_layer = _replay_us(every_layer, args.steps, cuda) / len(layers)
        timed.append({"tile": asdict(tile), "per_layer_us": per_layer, "table": asdict(tile) == table_tile})
    return sorted(timed, key=lambda entry: entry["per_layer_us"])


def _every_layer(delta, out, x, layers) -> None:
    """``delta`` of ``x`` into ``out`` by each layer's slot tensors in turn (one step's deltas of a projection)."""
    for projection in layers:
        delta(out, x, projection)


def _replay_us(work, steps: int, cuda: bool) -> float:
    """Microseconds per run of ``work``: replays of one CUDA graph of it on CUDA (captured after a warm-up run),
    eager runs on CPU."""
    import torch
    from harness.timing import mean_wall_us

    run = work
    if cuda:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            work()  # compile and warm up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            work()
        run = graph.replay
    return mean_wall_us(run, steps, min(10, steps), cuda)


def main_kernels(args: argparse.Namespace) -> int:
    """``--kernels``: time the deltas alone, print one line, write the JSON."""
    row = measure_deltas(args)
    parts = [
        f"{name} " + ", ".join(f"{path} {us:.2f}" for path, us in times.items())
        for name, times in row.per_layer_us.items()
    ]
    step = ", ".join(f"{path} {us:.1f}" for path, us in row.per_step_us.items())
    print(
        f"{row.preset} ({row.device}, {row.tokens} tokens, {row.adapters} adapters of rank {row.rank}): LoRA delta "
        f"per layer (us): {'; '.join(parts)}; per step of {row.layers} layers (us): {step}"
    )
    for name, timed in row.sweep.items():
        table = next((entry for entry in timed if entry["table"]), None)
        table_note = f"; the table's tile {table['per_layer_us']:.2f} us" if table else "; the table's tile not swept"
        print(
            f"sweep {name}: {len(timed)} tiles, fastest {timed[0]['per_layer_us']:.2f} us "
            f"{timed[0]['tile']}{table_note}"
        )
    out = args.out if args.out != DEFAULT_OUT else DEFAULT_OUT.with_name("lora_kernels.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(asdict(row), indent=2))
    print(f"wrote {out}")
    return 0


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
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--kernels", action="store_true", help="time the delta alone per projection, torch against fused"
    )
    parser.add_argument(
        "--sweep", action="store_true", help="with --kernels: time the fused delta over every tile of sweep_tiles"
    )
    args = parser.parse_args(argv)
    if args.sweep and not args.kernels:
        parser.error("--sweep times the fused delta's tiles: it goes with --kernels")
    if args.device == "cpu":
        args.attention_backend = "torch"
    else:
        reason = cuda_unavailable_reason()
        if reason is not None:
            print(f"skipped: {reason}", file=sys.stderr)
            return 2
    if args.kernels:
        return main_kernels(args)
    row = measure(args)
    ratios = row.ratios
    print(
        f"{row.preset} ({row.backend}, {row.device}, {row.buckets} buckets, batch {row.batch}, {row.adapters} adapters "
        f"of rank {row.rank}): decode step {row.plain_step_us:.1f} us without LoRA, {row.lora_step_us:.1f} us with "
        f"(lora/plain {ratios['lora_over_plain']:.3f}, target <= {STEP_TARGET}); graph memory "
        f"{row.plain_graph_bytes / 2**20:.1f} MiB plain + {row.lora_graph_bytes / 2**20:.1f} MiB LoRA variant "
        f"(both/plain {ratios['graph_bytes_ratio']:.3f}, target <= {MEMORY_TARGET}); adapter slots "
        f"{row.adapter_slot_bytes / 2**20:.1f} MiB; replays {row.replays}; delta {row.lora_kernels}"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**asdict(row), "ratios": ratios}, indent=2))
    print(f"wrote {args.out}")
    graphed = row.device == "cpu" or (row.replays.get("decode", 0) > 0 and row.replays.get("decode lora", 0) > 0)
    return 0 if graphed else 1


if __name__ == "__main__":
    raise SystemExit(main())
