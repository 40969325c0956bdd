"""The harness command line: ``run`` (the default) measures and writes a result; ``compare OLD NEW`` flags every
ratio that got more than 10 % worse; ``merge`` joins runs of one machine; ``show`` prints a saved result's report.

    python bench/run.py [--quick] [--check] [--sections decode,breaks,...] [--kernel-counts separate|inline|off]
                        [--out-dir DIR]
    python bench/run.py compare OLD.json NEW.json [--tolerance 0.10]
    python bench/run.py show RESULT.json [--markdown] [--check]

Exit status of ``run``: 1 when a configuration gave a wrong answer (or one of ours raised), when a migration run
exited non-zero, or with ``--check`` when a stated target was missed; else 0. Sections that need CUDA skip with the
reason on a machine without it.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from .compare import DEFAULT_TOLERANCE, compare_report
from .kernel_pass import COUNT_ITERATIONS, KernelCounts, count_in_child
from .migration import MigrationSettings, run_migration, usable_cores
from .profiles import PROFILES, Profile
from .report import format_report
from .rows import ROW_TYPES, BenchResult, WrongAnswer
from .targets import check_targets

SECTIONS = ("decode", "breaks", "prefill", "speculative", "capture", "compile", "lifecycle", "migration", "tp")
"""Every section, in run order."""
DEFAULT_SECTIONS = tuple(name for name in SECTIONS if name != "tp")
"""What a run without ``--sections`` measures: ``tp`` starts processes of its own on every GPU and loads Llama-3
shapes, so it runs when asked for."""
CPU_SECTIONS = frozenset({"migration"})
DEFAULT_OUT_DIR = Path(__file__).resolve().parents[1] / "results"


def cuda_unavailable_reason() -> str | None:
    """Why the CUDA sections cannot run here, or None."""
    if importlib.util.find_spec("torch") is None:
        return f"torch is not installed for {sys.executable}"
    import torch

    if not torch.cuda.is_available():
        return f"CUDA is not available (torch {torch.__version__}): the section needs a CUDA device"
    return None


def _parse_sections(text: str) -> tuple[str, ...]:
    chosen = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in chosen if name not in SECTIONS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")
    return chosen


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``run`` options (``compare`` is dispatched before parsing)."""
    parser = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="short smoke run (about 13 minutes on an H200 with cold compile caches: split it with --sections and "
        "--configs where a call has a time limit, then merge)",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a stated target is missed")
    parser.add_argument(
        "--sections",
        type=_parse_sections,
        default=DEFAULT_SECTIONS,
        help=f"comma-separated: {SECTIONS} (default: all but tp)",
    )
    parser.add_argument("--presets", nargs="+", help="override the profile's model presets")
    parser.add_argument(
        "--batch-sizes", nargs="+", type=_positive_int, help="override the profile's decode batch sizes"
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        metavar="NAME",
        help="measure only these decode/prefill rows (eager and raw, the references, always run), e.g. "
        "tc_piecewise/inductor full",
    )
    parser.add_argument(
        "--attention-backend",
        default="auto",
        choices=("auto", "torch", "flashinfer", "triton"),
        help="the engine's attention backend in every section (default auto: triton, then flashinfer, then torch, the "
        "first that can run; 'torch' compares with results measured before auto was the default)",
    )
    parser.add_argument(
        "--kernel-backend",
        default="auto",
        choices=("auto", "torch", "triton", "flashinfer"),
        help="the engine's kernel set in the decode, prefill and speculative sections (default auto: the fastest "
        "that can run: triton on CUDA, compiled rows included, since torch.compile keeps its kernels as custom ops; "
        "never flashinfer where a row compiles; 'torch' compares with results measured before the Triton set "
        "could be traced)",
    )
    parser.add_argument(
        "--kernel-counts",
        type=KernelCounts,
        default=KernelCounts.SEPARATE,
        choices=list(KernelCounts),
        metavar="{" + ",".join(mode.value for mode in KernelCounts) + "}",
        help="where decode device activities per step are counted: 'separate' (default) in a second process after "
        "the timing, 'inline' after each timed row (slows the host of later rows), 'off'",
    )
    parser.add_argument(
        "--tp-sizes",
        nargs="+",
        type=_positive_int,
        help="tensor-parallel sizes of the tp section, for every preset (default: the profile's; sizes this machine's "
        "GPUs or the model's heads cannot take are skipped)",
    )
    parser.add_argument("--count-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="where the JSON and plots go")
    return parser


def _gpu_sections(args: argparse.Namespace, profile: Profile) -> dict[str, Callable[[BenchResult], None]]:
    """Section name -> the function that runs it (imported here: these modules need torch and the engine)."""
    from .breaks import BreakSettings, run_breaks
    from .capture import CaptureSettings, run_capture, run_compile
    from .configs import CAPTURE_BACKENDS, DECODE_CONFIGS, PREFILL_CONFIGS, select_configs
    from .decode import DecodeSettings, run_decode
    from .lifecycle import LifecycleSettings, run_lifecycle
    from .models import ModelCache
    from .prefill import PrefillSettings, run_prefill
    from .speculative import SpeculativeSettings, run_speculative
    from .tensor_parallel import BACKENDS as TP_BACKENDS
    from .tensor_parallel import TensorParallelSettings, run_tensor_parallel
    from .timing import copy_bandwidth_bytes_per_second

    models = ModelCache()
    presets = tuple(args.presets or profile.presets)
    names = frozenset(args.configs) if args.configs else None
    backend = args.attention_backend
    capture = CaptureSettings(
        presets, profile.capture_decode_max_bs, profile.capture_prefill_max_tokens, presets[0],
        profile.compile_buckets, backend,
        tuple((phase, config) for phase, config in CAPTURE_BACKENDS if names is None or config.name in names),
    )  # fmt: skip

    def decode(result: BenchResult) -> None:
        bandwidth = copy_bandwidth_bytes_per_second()
        result.environment["copy_bandwidth_gb_per_s"] = bandwidth / 1e9
        settings = DecodeSettings(
            presets, profile.batch_sizes, profile.context_len, profile.iterations, backend,
            select_configs(DECODE_CONFIGS, names), count_kernels=args.kernel_counts is KernelCounts.INLINE,
            kernel_backend=args.kernel_backend,
        )  # fmt: skip
        run_decode(result, settings, models, bandwidth)

    def tensor_parallel(result: BenchResult) -> None:
        tp_presets = tuple(
            (preset, tuple(args.tp_sizes) if args.tp_sizes else sizes)
            for preset, sizes in profile.tp_presets
            if not args.presets or preset in args.presets
        )
        if args.presets and not tp_presets:
            tp_presets = tuple((preset, tuple(args.tp_sizes or (1, 2, 4))) for preset in args.presets)
        batch_sizes = tuple(args.batch_sizes) if args.batch_sizes else profile.tp_batch_sizes
        tp_backend = "triton" if backend == "auto" else backend
        backends = tuple(name for name in TP_BACKENDS if names is None or name in names or name in ("eager", "raw"))
        settings = TensorParallelSettings(
            tp_presets, batch_sizes, profile.context_len, profile.iterations, tp_backend, args.kernel_backend,
            backends,
        )  # fmt: skip
        run_tensor_parallel(result, settings)

    return {
        "tp": tensor_parallel,
        "decode": decode,
        "breaks": lambda result: run_breaks(
            result, BreakSettings(profile.iterations, profile.context_len, backend), models
        ),
        "prefill": lambda result: run_prefill(
            result,
            PrefillSettings(
                presets,
                profile.prefill_shapes,
                profile.iterations,
                backend,
                select_configs(PREFILL_CONFIGS, names),
                kernel_backend=args.kernel_backend,
            ),
            models,
        ),
        "speculative": lambda result: run_speculative(
            result,
            SpeculativeSettings(
                presets,
                profile.verify_batch_sizes,
                profile.speculative_drafts,
                profile.mixed_shapes,
                profile.context_len,
                profile.iterations,
                backend,
                kernel_backend=args.kernel_backend,
                eagle_drafts=profile.eagle_drafts,
            ),
            models,
        ),
        "capture": lambda result: run_capture(result, capture, models),
        "compile": lambda result: run_compile(result, capture),
        "lifecycle": lambda result: run_lifecycle(
            result,
            LifecycleSettings(
                tuple(args.presets or profile.lifecycle_presets),
                attention_backend=backend,
                kernel_backend=args.kernel_backend,
            ),
        ),
    }


def _unknown_configs(names: list[str]) -> str | None:
    """What is wrong with ``--configs`` (names no section measures, and the allowed ones), or None."""
    from .configs import selectable_config_names

    allowed = selectable_config_names()
    unknown = [name for name in names if name not in allowed]
    if not unknown:
        return None
    return f"unknown --configs {unknown}; allowed: {', '.join(allowed)}"


def _describe_machine() -> dict[str, Any]:
    if importlib.util.find_spec("torch") is None:
        return {"date": datetime.date.today().isoformat(), "device": "cpu", "torch": None}
    from .environment import describe_machine

    return describe_machine()


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """Measure the chosen sections, print the report, write the JSON and plots; the exit status. ``argv`` (the
    arguments ``args`` came from) is what a separate kernel-counting pass is started with."""
    profile = PROFILES["quick" if args.quick else "full"]
    if args.batch_sizes:
        profile = replace(profile, batch_sizes=tuple(sorted(set(args.batch_sizes))))
    if args.count_only:
        profile = replace(profile, iterations=COUNT_ITERATIONS)
    result = BenchResult(
        environment=_describe_machine(),
        settings={"profile": "quick" if args.quick else "full", "sections": list(args.sections), **asdict(profile)},
    )
    result.settings["kernel_counts"] = "count pass" if args.count_only else args.kernel_counts.value
    from cudagraph.engine.attention.choice import AUTO_ORDER as ATTENTION_AUTO_ORDER
    from cudagraph.engine.kernels import AUTO_ORDER

    # Engines take the attention backend --attention-backend names; "auto": the first of this order that can run.
    result.settings["attention_backend"] = {"choice": args.attention_backend, "order": list(ATTENTION_AUTO_ORDER)}
    # Engines take the kernel set --kernel-backend names; "auto": the first of this order that can run (triton on CUDA,
    # compiled rows included: tc_piecewise traces its operations as custom ops; never flashinfer where a row compiles).
    result.settings["kernel_backend"] = {"choice": args.kernel_backend, "order": list(AUTO_ORDER)}
    if args.presets:
        result.settings["presets"] = list(args.presets)
    if args.configs:
        unknown = _unknown_configs(args.configs)
        if unknown is not None:
            print(f"bench/run.py: {unknown}", file=sys.stderr)
            return 2
        result.settings["configs"] = list(args.configs)
    reason = cuda_unavailable_reason()
    sections: dict[str, Callable[[BenchResult], None]] = {}
    if reason is None:
        sections.update(_gpu_sections(args, profile))
    jobs = tuple(sorted({1, usable_cores()}))
    sections["migration"] = lambda result: run_migration(
        result, MigrationSettings(jobs, profile.migration_generated_files, profile.migration_real_tree)
    )
    for name in args.sections:
        if name not in sections:
            result.skip(name, "section", reason or "not available")
            write_checkpoint(result, args)
            continue
        print(f"== {name}", flush=True)
        try:
            sections[name](result)
        except Exception as error:  # a broken section is reported; the others still run
            traceback.print_exc()
            result.wrong.append(WrongAnswer(name, "section", f"raised {type(error).__name__}: {error}"))
        write_checkpoint(result, args)
    if args.kernel_counts is KernelCounts.SEPARATE and result.decode:
        count_in_child(result, argv)
    return finish(result, args)


def write_checkpoint(result: BenchResult, args: argparse.Namespace) -> Path:
    """Write the sections measured so far to ``<stem>.partial.json`` (a run stopped early keeps them); ``finish``
    writes the complete result and removes it."""
    from .environment import result_stem

    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"{result_stem(result.environment, args.quick)}.partial.json"
    path.write_text(result.to_json())
    return path


def finish(result: BenchResult, args: argparse.Namespace) -> int:
    """Print the report and the targets, write the files; the exit status."""
    from .environment import result_stem
    from .plots import draw_plots, plots_unavailable_reason

    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = result_stem(result.environment, args.quick)
    path = args.out_dir / f"{stem}.json"
    if args.count_only:
        # The counting pass's timings run under the profiler and are discarded: a report or a target verdict of
        # them would read as the run's own. The parent copies the counts and prints the one report.
        path.write_text(result.to_json())
        (args.out_dir / f"{stem}.partial.json").unlink(missing_ok=True)
        return 1 if result.wrong else 0
    print(format_report(result))
    targets = check_targets(result)
    print("\n".join(str(target) for target in targets))
    path.write_text(result.to_json())
    (args.out_dir / f"{stem}.partial.json").unlink(missing_ok=True)
    print(f"wrote {path}")
    plots = draw_plots(result, args.out_dir, stem)
    if plots:
        print("plots: " + ", ".join(str(plot) for plot in plots))
    elif result.decode or result.prefill:
        print(f"no plots: {plots_unavailable_reason()}")
    migration_failed = any(row.exit_status for row in result.migration)
    not_converged = sorted({row.tree for row in result.migration if row.recheck_exit_status})
    if not_converged:
        # Reported, not failed: a second pass that still finds edits is a codemod bug, not a benchmark error.
        print(f"NOTE: a second cudagraph-migrate --check over {', '.join(not_converged)} still finds edits")
    missed = [target for target in targets if not target.met]  # not measured counts too, under --check
    if result.wrong:
        print(f"FAILED: {len(result.wrong)} wrong answer(s) or error(s), listed above")
    if migration_failed:
        print("FAILED: a migration run exited non-zero")
    if args.check and missed:
        unmeasured = sum(target.met is None for target in missed)
        print(f"FAILED --check: {len(missed) - unmeasured} target(s) missed, {unmeasured} not measured")
    return 1 if result.wrong or migration_failed or (args.check and missed) else 0


def compare_main(argv: list[str]) -> int:
    """``compare OLD NEW [--tolerance T]``: print the regressions; 1 when there is one."""
    parser = argparse.ArgumentParser(prog="bench/run.py compare", description="flag ratios that got worse")
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE)
    args = parser.parse_args(argv)
    text, regressed = compare_report(BenchResult.load(args.old), BenchResult.load(args.new), args.tolerance)
    print(text)
    return 1 if regressed else 0


def merge_main(argv: list[str]) -> int:
    """``merge RUN.json... --out MERGED.json``: write one result from several runs of one machine; 2 when they
    cannot be merged."""
    from .merge import MergeError, merge_files

    parser = argparse.ArgumentParser(
        prog="bench/run.py merge", description="one result from runs of the same machine (later runs win)"
    )
    parser.add_argument("runs", type=Path, nargs="+", help="result files, oldest first")
    parser.add_argument("--out", type=Path, required=True, help="where to write the merged result")
    args = parser.parse_args(argv)
    try:
        merged = merge_files(args.runs)
    except (MergeError, OSError, ValueError) as error:
        print(f"bench/run.py merge: {error}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(merged.to_json())
    counts = ", ".join(f"{len(getattr(merged, key))} {key}" for key in ROW_TYPES if getattr(merged, key))
    print(f"wrote {args.out} ({counts}) from {len(args.runs)} runs")
    return 0


def show_main(argv: list[str]) -> int:
    """``show RESULT.json [--markdown] [--check]``: print a saved result's report and its targets, as the run that
    wrote it did (``--markdown``: tables to paste into a results README); with ``--check``, 1 when a target is
    missed or not measured; 2 when the file cannot be read."""
    parser = argparse.ArgumentParser(prog="bench/run.py show", description="print a saved result's report")
    parser.add_argument("result", type=Path, help="a result file written by a run or by merge")
    parser.add_argument("--markdown", action="store_true", help="Markdown tables instead of aligned text")
    parser.add_argument("--check", action="store_true", help="exit 1 when a stated target is missed or not measured")
    args = parser.parse_args(argv)
    try:
        result = BenchResult.load(args.result)
    except (OSError, ValueError, TypeError, KeyError) as error:
        print(f"bench/run.py show: cannot read {args.result}: {error}", file=sys.stderr)
        return 2
    print(format_report(result, markdown=args.markdown))
    targets = check_targets(result)
    print("\n".join(str(target) for target in targets))
    return 1 if args.check and any(not target.met for target in targets) else 0


SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {"compare": compare_main, "merge": merge_main, "show": show_main}
"""First arguments that name a command over saved results (no torch, no GPU); anything else is ``run``."""


def main(argv: list[str]) -> int:
    """Dispatch ``compare``, ``merge``, ``show`` or ``run`` (the default; ``run`` may be spelled out)."""
    if argv and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]](argv[1:])
    if argv and argv[0] == "run":
        argv = argv[1:]
    return run(build_parser().parse_args(argv), argv)
