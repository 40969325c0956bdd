"""Device activities per step, counted in a second process after the timing pass.

torch.profiler's CUDA activity leaves CUPTI attached to the process: on the H100, a bare ``CUDAGraph.replay()`` took
5.7 µs of host time before the first profiled step and 16-31 µs after it, and a runner replay more than twice as long.
A count taken between two timed rows would slow every row timed after it, so the timing pass counts nothing and a
child process, which times nothing that is kept, re-runs the decode rows only to count what the device runs per step.
"""

from __future__ import annotations

import enum
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from .merge import ROW_KEYS
from .profiles import Iterations
from .rows import BenchResult

COUNT_ITERATIONS = Iterations(warmup=1, timed=2)
"""What the counting pass times (it only needs each row checked and run; its timings are discarded)."""


class KernelCounts(str, enum.Enum):
    """``--kernel-counts``: where device activities per step are counted."""

    SEPARATE = "separate"
    """In a child process after the timing pass (the default: no timed row runs after a profiled one)."""
    INLINE = "inline"
    """Right after each row is timed, in the timing process (later rows' host times are slower: see above)."""
    OFF = "off"
    """Not counted (the rows' ``kernels_per_step`` stay empty)."""


def counting_argv(argv: Sequence[str], out_dir: Path) -> list[str]:
    """The harness arguments of the counting pass: the run's own, with decode alone, counts inline, the short
    iterations, and ``out_dir`` for its result (``--check`` dropped: the pass reports nothing of its own)."""
    kept: list[str] = []
    skip_value = False
    for argument in argv:
        if skip_value:
            skip_value = False
            continue
        name = argument.split("=", 1)[0]
        if name in ("--sections", "--kernel-counts", "--out-dir"):
            skip_value = "=" not in argument
            continue
        if name in ("--check", "--count-only"):
            continue
        kept.append(argument)
    return [*kept, "--sections", "decode", "--kernel-counts", KernelCounts.INLINE.value, "--count-only",
            "--out-dir", str(out_dir)]  # fmt: skip


def fill_kernel_counts(result: BenchResult, counted: BenchResult) -> int:
    """Copy ``kernels_per_step`` from ``counted``'s decode rows onto ``result``'s rows of the same preset,
    configuration and batch size; the number of rows filled."""
    key_of = ROW_KEYS["decode"]
    counts = {key_of(row): row.kernels_per_step for row in counted.decode}
    filled = 0
    for index, row in enumerate(result.decode):
        count = counts.get(key_of(row))
        if count is not None:
            result.decode[index] = replace(row, kernels_per_step=count)
            filled += 1
    return filled


def count_in_child(result: BenchResult, argv: Sequence[str]) -> None:
    """Run the counting pass as ``python -m harness`` and fill ``result``'s decode rows from it; a pass that fails
    leaves the counts empty and says why in ``result.skipped``."""
    with tempfile.TemporaryDirectory(prefix="harness-kernels-") as folder:
        print("== decode device activities per step (a second process: the profiler slows the host after it)")
        status = subprocess.call([sys.executable, "-m", "harness", *counting_argv(argv, Path(folder))])
        outputs = sorted(path for path in Path(folder).glob("*.json") if not path.name.endswith(".partial.json"))
        if not outputs:
            result.skip("decode", "device activities per step", f"the counting pass exited {status} with no result")
            return
        filled = fill_kernel_counts(result, BenchResult.load(outputs[0]))
        print(f"device activities counted for {filled} of {len(result.decode)} decode rows")
