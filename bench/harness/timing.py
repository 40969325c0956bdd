"""How a step is measured: CUDA events around back-to-back steps over rotating inputs, host time on an idle device,
device activities per step from torch.profiler, and the device copy bandwidth the weight floor is computed from."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .profiles import Iterations


@dataclass(frozen=True)
class StepTiming:
    """Median step time (CUDA events) and median host time of the call (µs)."""

    step_ms: float
    host_us: float


def time_steps(step: Callable[[int], object], iterations: Iterations) -> StepTiming:
    """Time ``step(i)`` (``i`` picks the rotating input).

    Step time: an event is recorded before and after every step while the host launches them back to back, so the
    device-side gap between the two includes any wait for a host that falls behind; the median over steps. Host
    time: each step launched onto an idle device, until the call returns.
    """
    for index in range(iterations.warmup):
        step(index)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iterations.timed)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iterations.timed)]
    for index in range(iterations.timed):
        starts[index].record()
        step(index)
        ends[index].record()
    torch.cuda.synchronize()
    step_ms = statistics.median(start.elapsed_time(end) for start, end in zip(starts, ends, strict=True))
    host = []
    for index in range(iterations.timed):
        started = time.perf_counter()
        step(index)
        host.append(time.perf_counter() - started)
        torch.cuda.synchronize()
    return StepTiming(step_ms=step_ms, host_us=statistics.median(host) * 1e6)


def mean_wall_us(run: Callable[[], object], steps: int, warmup: int = 10, cuda: bool = True) -> float:
    """Mean wall time in µs of ``steps`` back-to-back calls of ``run``, after ``warmup`` untimed ones; with ``cuda``
    the device is synchronized before and after the timed calls, so the figure includes their device work."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        run()
    sync()
    started = time.perf_counter()
    for _ in range(steps):
        run()
    sync()
    return 1e6 * (time.perf_counter() - started) / steps


def device_activities_per_step(step: Callable[[int], object], steps: int = 3) -> float | None:
    """Kernels, copies and memsets the device runs per step, as torch.profiler (CUPTI) records them; None when the
    profiler records no device activity (a build or driver without CUPTI)."""
    step(0)
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profiler:
        for index in range(steps):
            step(index)
        torch.cuda.synchronize()
    device_events = [event for event in profiler.events() if event.device_type == torch.autograd.DeviceType.CUDA]
    return len(device_events) / steps if device_events else None


def copy_bandwidth_bytes_per_second(size_bytes: int = 1 << 30, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth, counting the bytes read and the bytes written (median of ``repeats``)."""
    source = torch.empty(size_bytes, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    target.copy_(source)
    torch.cuda.synchronize()
    seconds = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target.copy_(source)
        end.record()
        end.synchronize()
        seconds.append(start.elapsed_time(end) / 1e3)
    del source, target
    torch.cuda.empty_cache()
    return 2 * size_bytes / statistics.median(seconds)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's distinct parameters (a tied LM head counted once: the step reads it once)."""
    seen: dict[int, int] = {}
    for parameter in model.parameters():
        seen[parameter.data_ptr()] = parameter.numel() * parameter.element_size()
    return sum(seen.values())
