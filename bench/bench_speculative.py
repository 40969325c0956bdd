"""Speculative verify steps and mixed batches, graphed against eager (a script, not a test).

    python3 bench/bench_speculative.py [--preset qwen3-0.6b-random] [--batch-sizes 1 8 32] [--drafts 3]
        [--mixed 8x48 32x96] [--out bench-results/speculative.json]

Rows:

- ``verify``: a verify step of ``B`` requests, each its last token and ``--drafts`` drafts over ``--context`` cached
  tokens; eager forward against the verify runner's ``full`` graph (``ModelRunner.init_verify_cuda_graph``).
- ``mixed``: one extend step of ``B`` running requests' next tokens beside a ``C``-token prompt chunk; eager
  forward against the prefill runner's ``breakable`` graph.

Each figure is the median of ``--repeats`` timings of ``--steps`` back-to-back steps (CUDA events), in ms a step; the
ratio is eager over graphed, measured in the same run. ``--attention-backend`` is ``triton`` (default) or ``torch``,
the two that run verify steps. Prints a table and writes JSON. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(path) for path in sorted(ROOT.glob("packages/*/src"))]

from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig  # noqa: E402
from cudagraph.engine.batch import Request, SamplingParams, make_extend_batch, make_verify_batch  # noqa: E402
from cudagraph.engine.model import model_config_from_preset, random_model  # noqa: E402
from cudagraph.engine.model_runner import CacheConfig, ModelRunner  # noqa: E402


@dataclass
class Row:
    """One measured step kind at one size: ms a step eager and graphed, and their ratio."""

    kind: str
    requests: int
    tokens: int
    eager_ms: float
    graph_ms: float

    @property
    def speedup(self) -> float:
        """Eager over graphed."""
        return self.eager_ms / self.graph_ms


def step_ms(step: Callable[[], object], steps: int, repeats: int) -> float:
    """Median over ``repeats`` of the device time of ``steps`` back-to-back calls of ``step``, per call."""
    for _ in range(3):
        step()
    timings = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            step()
        end.record()
        end.synchronize()
        timings.append(start.elapsed_time(end) / steps)
    return statistics.median(timings)


def admitted(model_runner: ModelRunner, count: int, context: int, seed: int) -> list[Request]:
    """``count`` requests with ``context`` prompt tokens cached (an eager extend step) and one token generated."""
    generator = torch.Generator().manual_seed(seed)
    vocab = model_runner.model.config.vocab_size
    requests = []
    for index in range(count):
        prompt = torch.randint(0, vocab, (context,), generator=generator).tolist()
        requests.append(model_runner.hold(Request(index, prompt, SamplingParams(max_new_tokens=16), lookahead=8)))
    logits = model_runner.forward(make_extend_batch(requests, model_runner.device))
    for request, token in zip(requests, logits.argmax(-1).tolist(), strict=True):
        request.cached_len = len(request.token_ids)
        request.output_ids.append(token)
    return requests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="qwen3-0.6b-random")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--attention-backend", choices=("triton", "torch"), default="triton")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--drafts", type=int, default=3)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--mixed", nargs="+", default=["8x48", "32x96"], help="RUNNINGxCHUNK cases")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "speculative.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")

    mixed_cases = [tuple(int(part) for part in case.split("x")) for case in args.mixed]
    decode_buckets = tuple(sorted({1, 2, 4, 8, 16, 32, *args.batch_sizes}))
    prefill_max = max(running + chunk for running, chunk in mixed_cases)
    prefill_buckets = tuple(sorted({16, 32, 64, 128, 256, prefill_max}))
    config = CudaGraphConfig(
        decode=PhaseConfig(Backend.FULL, decode_buckets, max(decode_buckets)),
        prefill=PhaseConfig(Backend.BREAKABLE, prefill_buckets, max(prefill_buckets)),
    )
    model = random_model(model_config_from_preset(args.preset), seed=0, dtype=args.dtype, device="cuda")
    cache = CacheConfig(max_num_reqs=max(decode_buckets) + 2, max_context_len=args.context + prefill_max + 32)
    model_runner = ModelRunner(model, config, cache_config=cache, attention_backend=args.attention_backend)
    rows: list[Row] = []
    try:
        model_runner.init_cuda_graphs()
        verify = model_runner.init_verify_cuda_graph(args.drafts + 1)
        assert verify is not None
        for batch_size in args.batch_sizes:
            requests = admitted(model_runner, batch_size, args.context, seed=batch_size)
            drafts = [[request.token_ids[-1]] * args.drafts for request in requests]
            batch = make_verify_batch(requests, drafts, model_runner.device)
            eager = step_ms(lambda batch=batch: model_runner.forward(batch), args.steps, args.repeats)
            graph = step_ms(lambda batch=batch: verify.replay(batch), args.steps, args.repeats)
            rows.append(Row("verify", batch_size, batch.num_tokens, eager, graph))
            for request in requests:
                model_runner.release(request)
        prefill = model_runner.prefill_cuda_graph_runner
        assert prefill is not None
        for running, chunk in mixed_cases:
            requests = admitted(model_runner, running + 1, args.context, seed=running)
            prompt_request = requests[-1]
            prompt_request.cached_len = 0  # its prompt goes again, as a chunk, beside the others' next tokens
            batch = make_extend_batch(requests, model_runner.device, [1] * running + [chunk])
            eager = step_ms(lambda batch=batch: model_runner.forward(batch), args.steps, args.repeats)
            graph = step_ms(lambda batch=batch: prefill.replay(batch), args.steps, args.repeats)
            rows.append(Row("mixed", running + 1, batch.num_tokens, eager, graph))
            for request in requests:
                model_runner.release(request)
    finally:
        model_runner.shutdown()

    print(f"{'kind':<8}{'requests':>9}{'tokens':>8}{'eager ms':>10}{'graph ms':>10}{'eager/graph':>13}")
    for row in rows:
        print(
            f"{row.kind:<8}{row.requests:>9}{row.tokens:>8}{row.eager_ms:>10.3f}{row.graph_ms:>10.3f}"
            f"{row.speedup:>13.2f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    settings = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    payload = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "settings": settings,
        "rows": [{**asdict(row), "speedup": row.speedup} for row in rows],
    }
    args.out.write_text(json.dumps(payload, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
