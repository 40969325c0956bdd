"""Where the device idles during a step: the kernels, copies and memsets torch.profiler (CUPTI) records over a few
back-to-back steps, and the idle time between them grouped by transition (the activity before -> the one after).

Comparing the timelines of two ways of running the same step shows where one loses time on the device: a
breakable graph and a full graph launch the same kernels, so the transitions the breakable one adds (a segment's
last kernel -> the eager kernel -> the next segment's first kernel) carry its whole GPU-side cost.
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch

_CALL_SIGNATURE = re.compile(r"^(?:void\s+)?([^<(]+)")
"""A CUDA kernel's demangled name up to its template arguments or parameters (``void ns::k<4, float>(...)``)."""


def short_name(name: str) -> str:
    """A device activity's name without its return type, anonymous namespaces, template arguments and parameters
    (Triton's kernels and ``Memcpy DtoD`` already are)."""
    match = _CALL_SIGNATURE.match(name.strip().replace("(anonymous namespace)::", ""))
    return match.group(1).strip() if match else name


@dataclass(frozen=True)
class DeviceActivity:
    """One kernel, copy or memset on the device, in microseconds on the profiler's clock."""

    name: str
    start_us: float
    end_us: float


@dataclass(frozen=True)
class Transition:
    """The idle time between two kinds of device activity, per step: how often one followed the other and the idle
    time before the second, in total and on average."""

    before: str
    after: str
    count: float
    idle_us: float

    @property
    def mean_idle_us(self) -> float:
        """Idle microseconds per occurrence."""
        return self.idle_us / self.count if self.count else 0.0


@dataclass(frozen=True)
class StepTimeline:
    """Per step: device activities, busy and idle microseconds between the first activity and the last, and the
    transitions by idle time (largest first)."""

    steps: int
    activities: float
    busy_us: float
    idle_us: float
    transitions: tuple[Transition, ...]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields, each transition with its mean idle time."""
        return {
            **{key: value for key, value in asdict(self).items() if key != "transitions"},
            "transitions": [{**asdict(item), "mean_idle_us": item.mean_idle_us} for item in self.transitions],
        }

    def format(self, top: int = 8) -> str:
        """A few lines: the totals, then the ``top`` transitions by idle time."""
        lines = [
            f"{self.activities:.0f} device activities a step, {self.busy_us:.1f} us busy, {self.idle_us:.1f} us idle "
            f"between them (mean of {self.steps} back-to-back steps)"
        ]
        for item in self.transitions[:top]:
            lines.append(
                f"  {item.idle_us:7.1f} us idle = {item.count:5.1f} x {item.mean_idle_us:4.2f} us  "
                f"{item.before} -> {item.after}"
            )
        return "\n".join(lines)


def summarize(activities: Iterable[DeviceActivity], steps: int) -> StepTimeline:
    """The ``StepTimeline`` of ``activities`` recorded over ``steps`` steps: each activity's idle time is the time
    from the latest end before it to its start (none when they overlap); the time before the first is not counted."""
    if steps < 1:
        raise ValueError(f"a timeline covers at least one step, got steps={steps}")
    ordered = sorted(activities, key=lambda activity: activity.start_us)
    busy = sum(activity.end_us - activity.start_us for activity in ordered)
    counts: dict[tuple[str, str], int] = defaultdict(int)
    idle: dict[tuple[str, str], float] = defaultdict(float)
    frontier = ordered[0].end_us if ordered else 0.0
    for previous, current in itertools.pairwise(ordered):
        key = (short_name(previous.name), short_name(current.name))
        counts[key] += 1
        idle[key] += max(0.0, current.start_us - frontier)
        frontier = max(frontier, current.end_us)
    transitions = sorted(
        (
            Transition(before, after, count / steps, idle[(before, after)] / steps)
            for (before, after), count in counts.items()
        ),
        key=lambda item: -item.idle_us,
    )
    return StepTimeline(
        steps=steps,
        activities=len(ordered) / steps,
        busy_us=busy / steps,
        idle_us=sum(item.idle_us for item in transitions),
        transitions=tuple(transitions),
    )


def sleep_cycles_per_ms(device: torch.device) -> float:
    """How many ``torch.cuda._sleep`` cycles keep ``device`` busy for a millisecond (measured once per call)."""
    cycles = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.device(device):
        torch.cuda._sleep(cycles // 10)  # warm-up
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
    return cycles / max(start.elapsed_time(end), 1e-3)


def record_timeline(
    step: Callable[[], object], device: torch.device, *, steps: int = 5, head_start_ms: float = 20.0
) -> StepTimeline:
    """Run ``step`` once to warm up, then ``steps`` times back to back (no sync between them, as a serving loop
    runs) under torch.profiler recording device activity only, and summarize what the device ran.

    The device first sleeps ``head_start_ms`` (long enough for the host to queue every step), so the idle times are
    the device's own and not waits for the host; the sleep is the first activity recorded, and is dropped."""
    step()
    torch.cuda.synchronize(device)
    cycles = int(sleep_cycles_per_ms(device) * head_start_ms)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
        torch.cuda._sleep(cycles)
        for _ in range(steps):
            step()
        torch.cuda.synchronize(device)
    recorded = sorted(
        (
            DeviceActivity(event.name, event.time_range.start, event.time_range.end)
            for event in profiler.events()
            if event.device_type == torch.autograd.DeviceType.CUDA
        ),
        key=lambda activity: activity.start_us,
    )
    if len(recorded) < 2:
        raise RuntimeError("torch.profiler recorded no device activity (a build or driver without CUPTI?)")
    return summarize(recorded[1:], steps)
