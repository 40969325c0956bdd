"""Launching Triton kernels without Triton's JIT call on the hot path.

Triton's JIT call (``kernel[grid](*args)``) binds every argument, works out its specialization and looks the
compiled kernel up on every launch: about 60 µs of host time a launch on the H100 machine's host, so 10 ms of host
time for an eager batch-1 decode step of 174 launches against 1 ms of GPU time. ``FastLauncher`` keys the compiled
kernels itself, on what Triton specializes a launch on (``launch_values_and_key``: each tensor's dtype and 16-byte
alignment, each integer's equality to 1, divisibility by 16 and width, each other argument's type), compiles
through the JIT once per key, and then calls the compiled kernel's C launcher. ``direct_launch`` goes further for
arguments that keep their addresses (a breakable graph's static buffers): everything but the stream is taken once,
at bind.

Where the shortcut is not known to hold, launches go through the JIT: under Triton's interpreter (the CPU tests),
on a Triton outside ``NATIVE_LAUNCH_VERSIONS``, for a compiled kernel that needs scratch memory, and while Triton's
launch hooks are set (a profiler reading them).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import triton

_LOG = logging.getLogger(__name__)

NATIVE_LAUNCH_VERSIONS = ("3.6.",)
"""Triton releases whose compiled launcher's C entry point takes the argument layout used here (grid, stream,
function, cooperative and PDL flags, two scratch buffers, packed metadata, launch metadata, two hooks, then the
kernel's arguments in signature order) and whose specialization ``launch_values_and_key`` mirrors."""

_INT32 = range(-(2**31), 2**31)
_UINT64_HIGH = range(2**63, 2**64)


def cdiv(numerator: int, denominator: int) -> int:
    """``ceil(numerator / denominator)`` for launch sizes (``triton.cdiv`` is a constexpr function: a few µs of host
    time a call, on a path run for every launch)."""
    return -(-numerator // denominator)


def next_power_of_2(value: int) -> int:
    """The smallest power of two at least ``value`` (and 0 for 0), as ``triton.next_power_of_2`` computes it,
    without its constexpr-function call."""
    return 1 << (value - 1).bit_length() if value > 0 else 0


def launch_values_and_key(args: tuple[Any, ...]) -> tuple[list[Any], list[Any]]:
    """One pass over a launch's runtime arguments: what the C launcher takes (tensors as their addresses) and what
    Triton 3.6 specializes them on, flattened: per tensor its dtype and whether its address is a multiple of 16; per
    integer its equality to 1, divisibility by 16 and width (0: i32, 1: u64, 2: i64); per other value its type. Each
    kind's first entry has a type of its own (a dtype, a bool, a type), so equal keys mean equal specializations."""
    values: list[Any] = []
    key: list[Any] = []
    for arg in args:
        if type(arg) is int:
            values.append(arg)
            key += (arg == 1, arg % 16 == 0, 0 if arg in _INT32 else 1 if arg in _UINT64_HIGH else 2)
        elif isinstance(arg, torch.Tensor):
            address = arg.data_ptr()
            values.append(address)
            key += (arg.dtype, address % 16 == 0)
        else:
            values.append(arg)
            key.append(type(arg))
    return values, key


def launch_prefix(function: int, cooperative: int, pdl: int, metadata: Any) -> tuple[Any, ...]:
    """What the C launcher takes between the stream and the kernel's arguments: the function, the cooperative-grid
    and PDL flags, no global or profile scratch, the packed metadata, no launch metadata and no hooks."""
    return (function, cooperative, pdl, None, None, metadata, None, None, None)


@dataclass(frozen=True)
class CompiledLaunch:
    """A compiled kernel's C launcher and what it takes besides the grid, the stream and the runtime arguments."""

    c_launch: Callable[..., None]
    prefix: tuple[Any, ...]
    """``launch_prefix`` of the compiled kernel."""
    constexprs: tuple[Any, ...]
    """The constexpr values, in the kernel's signature order (after its runtime arguments)."""

    def launch(self, grid: tuple[int, ...], stream: int, arguments: tuple[Any, ...] | list[Any]) -> None:
        """Launch over ``grid`` (1 to 3 dimensions) on ``stream`` with ``arguments`` (tensors as addresses)."""
        grid_x, grid_y, grid_z = (*grid, 1, 1)[:3]
        self.c_launch(grid_x, grid_y, grid_z, stream, *self.prefix, *arguments, *self.constexprs)


def _native_launch(launcher: object) -> tuple[Callable[..., None], int, int] | None:
    """The C entry point of a compiled kernel's launcher with its cooperative-grid and PDL flags, where calling it
    directly is what the launcher's Python ``__call__`` would do: a Triton of ``NATIVE_LAUNCH_VERSIONS`` and a
    kernel that needs no global or profile scratch (the ``__call__`` allocates those per launch). None otherwise."""
    if not triton.__version__.startswith(NATIVE_LAUNCH_VERSIONS):
        return None
    c_launch = getattr(launcher, "launch", None)
    flags = (getattr(launcher, "launch_cooperative_grid", None), getattr(launcher, "launch_pdl", None))
    scratch = (getattr(launcher, "global_scratch_size", None), getattr(launcher, "profile_scratch_size", None))
    if not callable(c_launch) or None in flags or scratch != (0, 0):
        return None
    return c_launch, int(flags[0]), int(flags[1])  # type: ignore[arg-type]


def _compile(
    kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...], constexprs: dict[str, Any], num_warps: int
) -> Any:
    """``kernel``'s compiled kernel for these arguments (compiled now, or found in Triton's caches)."""
    compiled = kernel.warmup(*args, grid=grid, **constexprs, num_warps=num_warps)
    return compiled.result() if hasattr(compiled, "result") else compiled


def _hooked(hook: object) -> bool:
    """Whether a Triton launch hook is set: a callable, or a chain of them (Triton 3.5+) that is not empty."""
    return hook is not None and bool(getattr(hook, "calls", True))


_RUNTIME_KNOBS = getattr(getattr(triton, "knobs", None), "runtime", None)
"""Triton's runtime settings, where its launch hooks are set (None on a Triton without ``knobs``)."""


def _launch_hooks_set() -> bool:
    runtime = _RUNTIME_KNOBS
    return runtime is None or _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook)


def _current_stream_getter() -> Callable[[int], int]:
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw  # type: ignore[no-any-return]
    return lambda device_index: torch.cuda.current_stream(device_index).cuda_stream


_current_raw_stream = _current_stream_getter()
"""CUDA device index -> the current stream's handle: torch's direct call where it has one (what Triton's own launch
path uses), with no ``Stream`` object made per launch."""


def _interpreted_types() -> tuple[type, ...]:
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return ()
    return (InterpretedFunction,)


_INTERPRETED = _interpreted_types()
"""The kernel type of Triton's interpreter (``TRITON_INTERPRET=1``): launched on CPU tensors, through its JIT call."""

_current_device: Callable[[], int] = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
"""The current CUDA device's index (the device Triton's JIT launches on)."""


class _JitSwitch(threading.local):
    on = False


_THROUGH_JIT = _JitSwitch()


@contextlib.contextmanager
def through_jit() -> Iterator[None]:
    """Inside the block, every ``FastLauncher`` call in this thread launches through Triton's JIT call (to compare
    against Triton's own path, or to time it: ``bench/bench_launch.py``). Bound launches made before are unchanged."""
    before, _THROUGH_JIT.on = _THROUGH_JIT.on, True
    try:
        yield
    finally:
        _THROUGH_JIT.on = before


class FastLauncher:
    """``kernel[grid](*args, **constexprs, num_warps=...)`` without the JIT call's per-launch work (see the module).

    Call it with the runtime arguments in the kernel's signature order and the constexprs by name; every
    constexpr follows the runtime arguments in the kernel's signature (a kernel declared otherwise always launches
    through the JIT)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.jit_only = (
            isinstance(kernel, _INTERPRETED)
            or not hasattr(kernel, "warmup")
            or not triton.__version__.startswith(NATIVE_LAUNCH_VERSIONS)
        )
        """Every launch goes through the JIT (Triton's interpreter, or a Triton this shortcut was not checked on)."""
        self._compiled: dict[Hashable, CompiledLaunch | None] = {}

    def __call__(
        self, grid: tuple[int, ...], args: tuple[Any, ...], constexprs: dict[str, Any], num_warps: int = 4
    ) -> None:
        """Launch ``kernel`` over ``grid`` on the current stream."""
        if self.jit_only or _THROUGH_JIT.on or _launch_hooks_set():
            self.kernel[grid](*args, **constexprs, num_warps=num_warps)
            return
        device = _current_device()
        values, specialization = launch_values_and_key(args)
        frozen = (device, num_warps, *constexprs.items(), *specialization)
        try:
            compiled = self._compiled[frozen]
        except KeyError:
            compiled = self._compiled[frozen] = self._native(grid, args, constexprs, num_warps)
        if compiled is None:
            self.kernel[grid](*args, **constexprs, num_warps=num_warps)
            return
        compiled.launch(grid, _current_raw_stream(device), values)

    def _native(
        self, grid: tuple[int, ...], args: tuple[Any, ...], constexprs: dict[str, Any], num_warps: int
    ) -> CompiledLaunch | None:
        """The C launch of these arguments' compiled kernel, or None where it must go through the JIT."""
        names = list(self.kernel.arg_names)
        if sorted(names[len(args) :]) != sorted(constexprs):
            _LOG.debug("%s: constexprs are not the trailing parameters; launching through the JIT", self.kernel)
            return None
        compiled = _compile(self.kernel, grid, args, constexprs, num_warps)
        native = _native_launch(getattr(compiled, "run", None))
        if native is None:
            return None
        c_launch, cooperative, pdl = native
        tail = tuple(constexprs[name] for name in names[len(args) :])
        return CompiledLaunch(
            c_launch, launch_prefix(compiled.function, cooperative, pdl, compiled.packed_metadata), tail
        )

    def bind(
        self, grid: tuple[int, ...], args: tuple[Any, ...], constexprs: dict[str, Any], num_warps: int = 4
    ) -> Callable[[], None]:
        """The launch with every argument taken now (``direct_launch``), or a JIT call with them bound where that
        is unavailable: for tensors that keep their addresses."""
        if not self.jit_only:
            direct = direct_launch(self.kernel, grid, args, constexprs, num_warps)
            if direct is not None:
                return direct
        return functools.partial(self.kernel[grid], *args, **constexprs, num_warps=num_warps)


def direct_launch(
    kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...], constexprs: dict[str, Any], num_warps: int
) -> Callable[[], None] | None:
    """``kernel[grid](*args, **constexprs, num_warps=num_warps)`` compiled now and bound to its launcher, or None
    where this Triton's compiled kernels lack the launch API used here (the caller then launches through the JIT).

    Each launch only asks for the current stream and calls the compiled kernel's launcher, with the tensors passed
    as the device addresses they have now (no pointer check per launch either); where ``_native_launch`` allows, it
    calls the launcher's C entry point itself, skipping the launcher's Python frame and its per-launch scratch
    lookups. For tensors that stay where they are (a breakable graph's static buffers and views). Where Triton's
    launch hooks are set (a profiler), launches go through the compiled kernel's own runner, which calls them."""
    try:
        compiled = _compile(kernel, grid, args, constexprs, num_warps)
        runner = compiled[grid]
        launcher, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    except (AttributeError, TypeError) as error:
        _LOG.debug("launching %s through the JIT: %s", getattr(kernel, "__name__", kernel), error)
        return None
    values = {**dict(zip(kernel.arg_names, args, strict=False)), **constexprs}
    bound = tuple(v.data_ptr() if isinstance(v, torch.Tensor) else v for v in (values[n] for n in kernel.arg_names))
    if _launch_hooks_set():
        return functools.partial(runner, *bound)
    device = next(arg.device for arg in args if isinstance(arg, torch.Tensor))
    current_stream = functools.partial(_current_raw_stream, device.index)
    grid_x, grid_y, grid_z = (*grid, 1, 1)[:3]
    native = _native_launch(launcher)
    if native is not None:
        c_launch, cooperative, pdl = native
        after_stream = (*launch_prefix(function, cooperative, pdl, metadata), *bound)

        def launch_native() -> None:
            c_launch(grid_x, grid_y, grid_z, current_stream(), *after_stream)

        return launch_native

    def launch() -> None:
        launcher(grid_x, grid_y, grid_z, current_stream(), function, metadata, None, None, None, *bound)

    return launch
