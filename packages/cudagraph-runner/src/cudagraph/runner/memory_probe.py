"""The probe captures behind ``estimate_capture_memory``: a few buckets captured into a scratch pool, with the device
memory read around each (``cudagraph.runner.memory_plan`` turns the readings into an estimate).

It captures through the backend and the runner's ``prepare_capture`` (the forward of one bucket, its attention
metadata pointed at the static buffers), never through the runner's static buckets: nothing it captures is kept.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Sequence

from cudagraph.backend import BaseCudaGraphBackend
from cudagraph.backend_utils import MemoryReading, freeze_gc

from .capture_loop import out_of_memory_guarded
from .memory_plan import ProbeCapture, probe_buckets

PrepareCapture = Callable[[int], Callable[[], object]]
"""A bucket's forward to capture, its attention metadata pointed at the static buffers (``_prepare_capture``)."""


def probe_captures(
    backend: BaseCudaGraphBackend, buckets: Sequence[int], prepare_capture: PrepareCapture
) -> tuple[list[ProbeCapture], list[int]]:
    """Capture ``probe_buckets`` in a scratch session and read the memory around each; the probes that fit, and the
    largest buckets that ran out of memory.

    Every bucket is warmed up once first, and each probe again just before its reading: what a first run loads for
    good (kernels loaded lazily, the capture stream's library workspaces) is then loaded before anything is
    measured, as it is before ``capture()`` measures, since the estimate runs first."""
    probes: list[ProbeCapture] = []
    out_of_memory: list[int] = []
    remaining = list(probe_buckets(buckets))
    with freeze_gc(enable_gc=not backend.options.freeze_gc), backend.scratch_session():
        _warm_up_every_bucket(backend, buckets, prepare_capture)
        while remaining:
            bucket = remaining.pop(0)
            before, ran_out = out_of_memory_guarded(functools.partial(_probe_capture, backend, bucket, prepare_capture))
            if ran_out or before is None:
                gc.collect()  # the failed forward's frames and tensors, now that the error is handled
                if probes:
                    break  # a smaller probe did not fit beside the larger ones: estimate from those that did
                out_of_memory.append(bucket)  # the largest does not fit now: probe the next largest instead
                remaining = list(probe_buckets([smaller for smaller in buckets if smaller < bucket]))
                continue
            after = backend.memory_reading()
            probes.append(
                ProbeCapture(
                    bucket,
                    bytes=before.free_bytes - after.free_bytes,
                    peak_bytes=max(0, after.peak_allocated_bytes - before.allocated_bytes),
                    kept_bytes=after.allocated_bytes - before.allocated_bytes,
                )
            )
    return probes, out_of_memory


def _probe_capture(backend: BaseCudaGraphBackend, bucket: int, prepare_capture: PrepareCapture) -> MemoryReading:
    """Warm ``bucket`` up, read the memory (the peak restarting), capture it; the reading before the capture."""
    forward_fn = prepare_capture(bucket)
    backend.warm_up(bucket, forward_fn)
    before = backend.memory_reading(reset_peak=True)
    backend.capture_one(bucket, forward_fn)
    return before


def _warm_up(backend: BaseCudaGraphBackend, bucket: int, prepare_capture: PrepareCapture) -> None:
    backend.warm_up(bucket, prepare_capture(bucket))


def _warm_up_every_bucket(
    backend: BaseCudaGraphBackend, buckets: Sequence[int], prepare_capture: PrepareCapture
) -> None:
    """One warm-up forward of each bucket, largest first (one that runs out of memory is left to its probe)."""
    ran_out = False
    for bucket in sorted(buckets, reverse=True):
        _, failed = out_of_memory_guarded(functools.partial(_warm_up, backend, bucket, prepare_capture))
        ran_out |= failed
    if ran_out:
        gc.collect()
