"""Graphs across an engine's life: the harness's ``lifecycle`` section on its own, with its sizes on the command line
(a script, not a test).

    python3 bench/bench_lifecycle.py [--presets qwen3-0.6b llama-3-8b] [--backend full] [--max-bs 256]
        [--attention-backend triton] [--replay-batch 8] [--out bench-results/lifecycle.json]

One row per preset (random bfloat16 weights, decode graphs only, the default bucket schedule up to ``--max-bs``;
``bench/harness/lifecycle.py`` says how each figure is taken), with its targets:

- start-up to first token under the ``eager`` and ``lazy`` capture policies: lazy at most 25 % of eager;
- the first-use capture of decode bucket ``--replay-batch`` under ``lazy``, after the engine's first step: at most
  100 ms;
- the bytes ``sleep()`` frees against the graphs' and KV cache's: at least 95 %;
- ``wake()`` with the first replayed step against the first capture of every bucket: at most 1x;
- a replayed step of ``--replay-batch`` after an in-place update of every weight against before: within 5 %, and
  no bucket captured again.

Prints the section's table and its targets, and writes the harness's JSON (``python3 bench/run.py compare`` reads
it). Exit status 1 when the in-place update captured a bucket again or a measurement raised. Needs CUDA;
``python3 bench/run.py --sections lifecycle`` runs the same section with the profile's presets.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), *(str(path) for path in sorted(ROOT.glob("packages/*/src")))]

from harness.cli import cuda_unavailable_reason  # noqa: E402
from harness.presets import BENCH_PRESETS  # noqa: E402
from harness.profiles import PROFILES  # noqa: E402
from harness.report import format_report  # noqa: E402
from harness.rows import BenchResult  # noqa: E402
from harness.targets import LIFECYCLE_TARGETS, SLEEP_TARGETS, check_targets  # noqa: E402

from cudagraph.config import Backend  # noqa: E402

if TYPE_CHECKING:  # the section imports torch: not before the CUDA check
    from harness.lifecycle import LifecycleSettings


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The script's options; the defaults are the section's (presets: the quick profile's)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--presets", nargs="+", default=list(PROFILES["quick"].lifecycle_presets), choices=list(BENCH_PRESETS)
    )
    graph_backends = [backend.value for backend in Backend if backend is not Backend.DISABLED]
    parser.add_argument("--backend", choices=graph_backends, default="full", help="the decode graph backend")
    parser.add_argument("--max-bs", type=_positive_int, default=256, help="the largest decode bucket captured")
    parser.add_argument("--attention-backend", choices=("auto", "triton", "torch", "flashinfer"), default="triton")
    parser.add_argument("--kernel-backend", choices=("auto", "torch", "triton", "flashinfer"), default="auto")
    parser.add_argument(
        "--replay-batch",
        type=_positive_int,
        default=8,
        help="the bucket captured on first use, and the batch of the replay and wake rows (2 to --max-bs)",
    )
    parser.add_argument("--replay-steps", type=_positive_int, default=200, help="steps a replay figure averages")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "lifecycle.json")
    return parser


def section_settings(args: argparse.Namespace, parser: argparse.ArgumentParser) -> LifecycleSettings:
    """The section's settings from the options; a combination the section refuses is one parser error (exit 2)."""
    from harness.lifecycle import LifecycleSettings

    try:
        return LifecycleSettings(
            presets=tuple(args.presets),
            backend=args.backend,
            max_bs=args.max_bs,
            attention_backend=args.attention_backend,
            kernel_backend=args.kernel_backend,
            replay_batch=args.replay_batch,
            replay_steps=args.replay_steps,
        )
    except ValueError as error:
        parser.error(str(error))


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table and the section's targets, write the JSON; 1 on a wrong answer or an error."""
    parser = build_parser()
    args = parser.parse_args(argv)
    reason = cuda_unavailable_reason()
    if reason is not None:
        parser.error(reason)
    settings = section_settings(args, parser)

    from harness.environment import describe_machine
    from harness.lifecycle import run_lifecycle

    result = BenchResult(environment=describe_machine(), settings={"script": "bench_lifecycle", **vars(args)})
    result.settings["out"] = str(args.out)
    run_lifecycle(result, settings)
    print(format_report(result))
    print("\n".join(str(target) for target in check_targets(result, (*LIFECYCLE_TARGETS, *SLEEP_TARGETS))))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(result.to_json())
    print(f"wrote {args.out}")
    return 1 if result.wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
