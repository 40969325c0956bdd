"""Measuring one configuration on one shape: warm it, check its greedy tokens against eager's (a wrong answer is
recorded and not timed), then time it over the rotating batches and count its device activities."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from cudagraph.runner import ForwardBatch

from .configs import BenchConfig
from .profiles import Iterations
from .rows import BenchResult, WrongAnswer
from .sources import SourceUnavailableError
from .timing import StepTiming, device_activities_per_step, time_steps
from .workload import StepFn, check_tokens

WARM_CALLS = 3
"""Calls of a step before its answer is checked (torch.compile records its graphs on the first ones)."""


@dataclass(frozen=True)
class Measured:
    """A configuration's timing on one shape and its device activities per step."""

    timing: StepTiming
    kernels_per_step: float | None


def measure_step(
    result: BenchResult,
    section: str,
    what: str,
    step: StepFn,
    eager: StepFn,
    batches: list[ForwardBatch],
    iterations: Iterations,
    count_kernels: bool = True,
) -> Measured | None:
    """Check, then time ``step`` over ``batches``; None (and a ``WrongAnswer`` in ``result``) when its tokens are
    wrong."""
    reference = eager(batches[0]).float().clone()
    for _ in range(WARM_CALLS):
        step(batches[0])
    check = check_tokens(reference, step(batches[0]).float().clone())
    if not check.ok:
        result.wrong.append(WrongAnswer(section, what, str(check)))
        return None

    def rotating(index: int) -> object:
        return step(batches[index % len(batches)])

    timing = time_steps(rotating, iterations)
    kernels = device_activities_per_step(rotating) if count_kernels else None
    # One line per measured row as it lands, so a run cut short still shows what it measured.
    shown_kernels = f", {kernels:.0f} device activities" if kernels is not None else ""
    print(f"  {what}: {timing.step_ms:.3f} ms, host {timing.host_us:.0f} us{shown_kernels}", flush=True)
    return Measured(timing, kernels)


@contextmanager
def guarded(result: BenchResult, section: str, what: str, config: BenchConfig) -> Iterator[None]:
    """Turn a failure of ``what`` into a row: a source that cannot run is skipped with its reason; an error in one
    of our configurations fails the run (a ``WrongAnswer``); an error in a comparison row skips it."""
    try:
        yield
    except SourceUnavailableError as error:
        result.skip(section, what, str(error))
    except Exception as error:  # one failing row must not stop the others; it is reported instead
        message = f"raised {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        if config.ours:
            result.wrong.append(WrongAnswer(section, what, message))
        else:
            result.skip(section, what, message)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
