"""Speculative verify steps and mixed batches, graphed against eager: the harness's ``speculative`` section on its
own, with its sizes on the command line (a script, not a test).

    python3 bench/bench_speculative.py [--presets qwen3-0.6b] [--batch-sizes 1 8 32] [--drafts 3]
        [--mixed 8x48 32x96] [--eagle-drafts 3 5] [--attention-backend triton]
        [--out bench-results/speculative.json]

Rows (``bench/harness/speculative.py`` says how each is built and timed):

- ``verify``: a verify step of ``B`` requests, each its last token and ``--drafts`` drafts over ``--context`` cached
  tokens; eager forward against the verify runner's ``full`` graph (``ModelRunner.init_verify_cuda_graph``).
- ``mixed``: one extend step of ``R`` running requests' next tokens beside a ``C``-token prompt chunk; eager
  forward against the prefill runner's ``breakable`` graph.
- ``draft``: an EAGLE draft round of ``--eagle-batch-size`` requests (draft extend and ``k - 1`` chained draft
  steps, a random head) for each ``k`` of ``--eagle-drafts``, eager against the draft runners' ``full`` graphs; the
  draft graphs' capture seconds beside the target's decode capture for the same buckets; tokens a step with the
  self-draft head over a one-layer target (``bench/harness/drafting.py``).

Prints the section's table and writes the harness's JSON (``python3 bench/run.py compare`` reads it). Exit status 1
when a graphed step's tokens differ from eager's. Needs CUDA; ``python3 bench/run.py --sections speculative`` runs
the same section with the profile's sizes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), *(str(path) for path in sorted(ROOT.glob("packages/*/src")))]

from harness.cli import cuda_unavailable_reason  # noqa: E402
from harness.presets import BENCH_PRESETS  # noqa: E402
from harness.profiles import PROFILES, Iterations  # noqa: E402
from harness.report import format_report  # noqa: E402
from harness.rows import BenchResult  # noqa: E402


def _shape(text: str) -> tuple[int, int]:
    running, _, chunk = text.partition("x")
    try:
        return int(running), int(chunk)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected RUNNINGxCHUNK (e.g. 8x48), got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table, write the JSON; 1 on a wrong answer."""
    full = PROFILES["full"]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=[full.presets[0]], choices=list(BENCH_PRESETS))
    parser.add_argument("--attention-backend", choices=("auto", "triton", "torch", "flashinfer"), default="triton")
    parser.add_argument("--kernel-backend", choices=("auto", "torch", "triton", "flashinfer"), default="auto")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=list(full.verify_batch_sizes))
    parser.add_argument("--drafts", type=int, default=full.speculative_drafts)
    parser.add_argument("--context", type=int, default=full.context_len)
    parser.add_argument("--mixed", type=_shape, nargs="*", default=list(full.mixed_shapes), help="RUNNINGxCHUNK")
    parser.add_argument("--eagle-drafts", type=int, nargs="*", default=list(full.eagle_drafts), metavar="K")
    parser.add_argument("--eagle-batch-size", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=full.iterations.warmup)
    parser.add_argument("--timed", type=int, default=full.iterations.timed)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "speculative.json")
    args = parser.parse_args(argv)
    reason = cuda_unavailable_reason()
    if reason is not None:
        parser.error(reason)

    from harness.environment import describe_machine
    from harness.models import ModelCache
    from harness.speculative import SpeculativeSettings, run_speculative

    settings = SpeculativeSettings(
        presets=tuple(args.presets),
        verify_batch_sizes=tuple(args.batch_sizes),
        drafts=args.drafts,
        mixed_shapes=tuple(args.mixed),
        context_len=args.context,
        iterations=Iterations(args.warmup, args.timed),
        attention_backend=args.attention_backend,
        kernel_backend=args.kernel_backend,
        eagle_drafts=tuple(args.eagle_drafts),
        eagle_batch_size=args.eagle_batch_size,
    )
    result = BenchResult(environment=describe_machine(), settings={"script": "bench_speculative", **vars(args)})
    result.settings["out"] = str(args.out)
    run_speculative(result, settings, ModelCache())
    print(format_report(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(result.to_json())
    print(f"wrote {args.out}")
    return 1 if result.wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
