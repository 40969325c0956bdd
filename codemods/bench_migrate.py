"""Speed of ``cudagraph-migrate`` (a script, not a test): time ``cudagraph-migrate TREE -j N`` end to end on a real
tree (released SGLang source) or on a generated one, for several ``-j``, and check that a second run changes nothing.

    python codemods/bench_migrate.py --sglang 0.5.13              # -j 1, -j 2 and every usable core
    python codemods/bench_migrate.py --tree PATH --jobs 2
    python codemods/bench_migrate.py --files 1500 --jobs 2        # a generated legacy-style tree

Each run migrates a fresh copy. Prints a table and writes the measurements as JSON. Targets on SGLang 0.5.13
(2,406 files): at most 20 s with -j 2 and at most 10 s with every core of the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNNER_MODULE = '''"""Model runner {index}: owns the decode and prefill graph runners."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

import torch

from sglang.srt.model_executor.cuda_graph_runner import (
    CudaGraphRunner,
    get_batch_sizes_to_capture,
    get_is_capture_mode as capturing,  # used by the attention backend
)
from sglang.srt.model_executor.piecewise_cuda_graph_runner import PiecewiseCudaGraphRunner
from sglang.srt.model_executor.breakable_cuda_graph_runner import BreakableCudaGraphRunner
from sglang.srt.compilation.piecewise_context_manager import ForwardContext, set_forward_context

if TYPE_CHECKING:
    from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


class ModelRunner{index}:
    """Runs the model of worker {index}."""

    graph_runner: Optional[CudaGraphRunner] = None
    piecewise_cuda_graph_runner: "Optional[PiecewiseCudaGraphRunner]" = None

    def __init__(self, server_args: "ServerArgs", device: str = "cuda") -> None:
        self.server_args = server_args
        self.device = device
        self.dtype = torch.bfloat16

    def init_device_graphs(self) -> None:
        if self.server_args.disable_cuda_graph:
            return
        logger.info("capturing decode batch sizes %s", get_batch_sizes_to_capture(self))
        self.graph_runner = CudaGraphRunner(self)

    def init_piecewise_cuda_graphs(self) -> None:
        breakable = self.server_args.enable_breakable_cuda_graph
        runner_type = BreakableCudaGraphRunner if breakable else PiecewiseCudaGraphRunner
        self.piecewise_cuda_graph_runner = runner_type(self)

    def forward(self, batch, attn_backend=None):
        if self.graph_runner is not None and self.graph_runner.can_run(batch) and not capturing():
            return self.graph_runner.replay(batch)
        with set_forward_context(ForwardContext(forward_batch=batch, attn_backend=attn_backend, extra={{}})):
            return self._forward_eager(batch)
{filler}
'''

SERVER_MODULE = '''"""Launch helpers of deployment {index}."""

import subprocess

from cudagraph.legacy.server_args import Backend, resolve

BASE_ARGV = [
    "python", "-m", "sglang.launch_server",
    "--cuda-graph-max-bs", "{bs}",
    "--disable-piecewise-cuda-graph",
]


def launch_{index}(extra=()):
    argv = [*BASE_ARGV, "--cuda-graph-bs", "1", "2", "4", "{bs}", *extra]
    return subprocess.Popen(argv)


def config_{index}(flag):
    if flag == "tcpcg":
        return resolve(enforce_piecewise_cuda_graph=True, piecewise_cuda_graph_compiler="eager"), Backend.TCPIECEWISE
    return resolve(disable_cuda_graph=flag == "off", cuda_graph_bs=[1, 2, {bs}], cuda_graph_max_bs={bs})
{filler}
'''

TEST_MODULE = '''"""Tests of worker {index}."""

from unittest import mock

import pytest

import pymllm.executor.cuda_graph_runner as cgr
from cudagraph.legacy.piecewise_context_manager import is_in_piecewise_cuda_graph, enable_piecewise_cuda_graph


@mock.patch("pymllm.executor.cuda_graph_runner.get_is_capture_mode", return_value=True)
def test_capture_{index}(patched):
    with enable_piecewise_cuda_graph():
        assert is_in_piecewise_cuda_graph()
    assert cgr.get_is_capture_mode()


def test_runner_{index}(model_runner):
    with mock.patch.object(cgr.CudaGraphRunner, "capture_one_batch_size") as capture:
        model_runner.init_device_graphs()
    assert getattr(model_runner, "graph_runner") is not None
    assert capture.called
{filler}
'''

PLAIN_MODULE = '''"""Utilities {index}: nothing here uses the legacy names."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass
class Sampler{index}:
    temperature: float = 1.0
    top_p: float = 1.0

    def scale(self, logits: list[float]) -> list[float]:
        return [value / max(self.temperature, 1e-5) for value in logits]
{filler}
'''

FILLER_FUNCTION = '''

def helper_{index}_{n}(values, scale={scale}):
    """Helper {n}: a little arithmetic so the file looks like real code."""
    total = 0.0
    for position, value in enumerate(values):
        if position % {mod} == 0:
            total += value * scale
        else:
            total -= value / (position + 1)
    return {{"total": total, "count": len(values), "name": "helper_{index}_{n}"}}
'''

TEMPLATES = ((RUNNER_MODULE, 0.25), (SERVER_MODULE, 0.2), (TEST_MODULE, 0.2), (PLAIN_MODULE, 0.35))


def generate_tree(root: Path, count: int, seed: int = 0) -> int:
    """Write ``count`` files under ``root`` in package directories of 50; returns total bytes."""
    rng = random.Random(seed)
    templates = [template for template, _ in TEMPLATES]
    weights = [weight for _, weight in TEMPLATES]
    total = 0
    for index in range(count):
        template = rng.choices(templates, weights)[0]
        filler = "".join(
            FILLER_FUNCTION.format(index=index, n=n, scale=rng.randint(1, 9), mod=rng.randint(2, 5))
            for n in range(rng.randint(3, 12))
        )
        text = template.format(index=index, bs=rng.choice((8, 16, 32)), filler=filler)
        package = root / f"engine_{index // 50:03d}"
        package.mkdir(parents=True, exist_ok=True)
        path = package / f"module_{index:05d}.py"
        path.write_text(text)
        total += len(text)
    return total


TARGETS = ((2, 20.0, "-j 2"), (0, 10.0, "every core"))
"""(jobs, most seconds, label) for SGLang 0.5.13; jobs 0 means every usable core of the machine."""


def source_tree(args: argparse.Namespace, scratch: Path) -> tuple[Path, str]:
    """The tree to migrate (never modified: each run copies it) and its name."""
    if args.tree:
        return args.tree, args.tree.name
    if args.sglang:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "realtrees"))
        from trees import RealTree, fetch  # the tests' cache of released trees

        tree = RealTree("sglang", args.sglang, "sglang")
        print(fetch(tree))
        if not tree.ready():
            raise SystemExit(f"{tree.name} is not available (offline?)")
        return tree.path(), tree.name
    root = scratch / "generated"
    generate_tree(root, args.files)
    return root, f"generated-{args.files}"


def time_run(source: Path, jobs: int, scratch: Path) -> dict[str, object]:
    """Copy ``source``, migrate it with ``-j jobs``, re-check it; the measurements."""
    copy = scratch / f"run-j{jobs}"
    shutil.copytree(source, copy)
    files = sum(1 for _ in copy.rglob("*.py"))
    command = [sys.executable, "-m", "cudagraph.migrate.command", str(copy), "-j", str(jobs), "--no-progress", "-q"]
    started = time.perf_counter()
    migrated = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    recheck = subprocess.run([*command, "--check"], capture_output=True, text=True)
    shutil.rmtree(copy)
    return {
        "jobs": jobs,
        "files": files,
        "seconds": round(seconds, 2),
        "files_per_second": round(files / seconds, 1),
        "exit_status": migrated.returncode,
        "second_run_check_exit_status": recheck.returncode,
    }


def main() -> int:
    """Migrate, re-check, report."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source_group = parser.add_mutually_exclusive_group()
    source_group.add_argument("--tree", type=Path, help="a source tree to migrate (copied first)")
    source_group.add_argument("--sglang", metavar="VERSION", help="a released SGLang tree (downloaded and cached)")
    parser.add_argument("--files", type=int, default=1500, help="size of the generated tree (no --tree/--sglang)")
    parser.add_argument("--jobs", type=int, action="append", help="-j to time (repeatable; default 1, 2, all)")
    parser.add_argument("--json", type=Path, default=Path("bench-migrate.json"))
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0))
    jobs = args.jobs or sorted({1, 2, cpus})
    targets = [(count or cpus, seconds, label) for count, seconds, label in TARGETS] if args.sglang == "0.5.13" else []
    with tempfile.TemporaryDirectory(prefix="cudagraph-migrate-bench-") as scratch:
        source, name = source_tree(args, Path(scratch))
        runs = [time_run(source, count, Path(scratch)) for count in jobs]
    print(f"cudagraph-migrate over {name} ({runs[0]['files']} files), {cpus} usable cores, {platform.machine()}")
    print(f"{'-j':>3} {'seconds':>8} {'files/s':>8} {'exit':>5} {'recheck':>8}  targets")
    missed = []
    for run in runs:
        verdicts = []
        for count, seconds, label in targets:
            if count == run["jobs"]:
                met = float(run["seconds"]) <= seconds  # type: ignore[arg-type]
                verdicts.append(f"{label} <= {seconds:g} s {'met' if met else 'MISSED'}")
                if not met:
                    missed.append(label)
        print(
            f"{run['jobs']:>3} {run['seconds']:>8} {run['files_per_second']:>8} {run['exit_status']:>5} "
            f"{run['second_run_check_exit_status']:>8}  {'; '.join(verdicts)}"
        )
    result = {
        "tree": name,
        "runs": runs,
        "targets": [{"jobs": count, "seconds": seconds, "label": label} for count, seconds, label in targets],
        "missed": missed,
        "cpu_count": cpus,
        "machine": platform.machine(),
        "python": platform.python_version(),
    }
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")
    failed = any(run["exit_status"] != 0 or run["second_run_check_exit_status"] != 0 for run in runs)
    return 1 if failed or missed else 0


if __name__ == "__main__":
    sys.exit(main())
