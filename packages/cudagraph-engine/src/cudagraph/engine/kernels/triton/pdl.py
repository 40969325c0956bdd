"""Whether the engine's Triton kernels launch as programmatic dependent launches (PDL), and the switch that turns it
off.

With PDL a kernel may start while the kernel before it on the stream is still finishing (CUDA's programmatic stream
serialization; in a captured graph, a programmatic edge): what it does before ``tl.extra.cuda.gdc_wait()`` (reading
its weights, which no kernel writes) overlaps its predecessor's tail, and the launch gap between the two closes. Each
kernel of this package takes a ``PDL`` constexpr: with it, the kernel reads only weights before its
``gdc_wait()``, writes nothing before it, and lets the next kernel launch (``gdc_launch_dependents()``) once it has
passed it; its launcher passes ``launch_pdl=pdl`` to ``FastLauncher``, which compiles it with Triton's
``launch_pdl`` option. A kernel launched so after one that is not (a cuBLAS matmul, a copy) starts after it as
usual.

On where ``pdl_launch(device)`` says so: a CUDA device of compute capability 9.0 or newer (Hopper, Blackwell), a
Triton with ``gdc_wait`` and the ``launch_pdl`` option (3.4+; not its interpreter), and the switch on. The switch is
the environment variable ``CUDAGRAPH_TRITON_PDL`` (``0``, ``false``, ``off`` or ``no`` turn it off), read once, when
this module is first imported; ``use_pdl(False)`` turns it off for a block (the bench measures both ways in one
process: graphs captured inside the block keep the launches they captured).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Iterator

import torch
import triton

PDL_ENV = "CUDAGRAPH_TRITON_PDL"
"""The environment variable that turns PDL off (``0``, ``false``, ``off``, ``no``), read once at import."""

_OFF_WORDS = frozenset({"0", "false", "off", "no"})


@dataclasses.dataclass
class _Switch:
    on: bool


_SWITCH = _Switch(on=os.environ.get(PDL_ENV, "1").strip().lower() not in _OFF_WORDS)


def pdl_enabled() -> bool:
    """Whether the switch is on (``CUDAGRAPH_TRITON_PDL`` at import, or ``use_pdl``); ``pdl_launch`` also asks the
    device and Triton."""
    return _SWITCH.on


@contextlib.contextmanager
def use_pdl(enabled: bool) -> Iterator[None]:
    """Inside the block the switch is ``enabled`` (for every thread); the previous setting comes back after it."""
    before, _SWITCH.on = _SWITCH.on, enabled
    try:
        yield
    finally:
        _SWITCH.on = before


@functools.cache
def triton_supports_pdl() -> bool:
    """Whether this Triton compiles ``gdc_wait`` and takes the ``launch_pdl`` option (3.4+), outside its
    interpreter (which runs no CUDA instruction)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    gdc = getattr(getattr(triton.language.extra, "cuda", None), "gdc_wait", None)
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return gdc is not None and "launch_pdl" in {field.name for field in dataclasses.fields(CUDAOptions)}


@functools.cache
def _device_supports_pdl(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def pdl_launch(device: torch.device) -> bool:
    """Whether a launch on ``device`` is a programmatic dependent launch: the switch on, a CUDA device of compute
    capability 9.0+, and a Triton that supports it (the last two asked once per device)."""
    return (
        _SWITCH.on
        and device.type == "cuda"
        and triton_supports_pdl()
        and _device_supports_pdl(device.index if device.index is not None else torch.cuda.current_device())
    )
