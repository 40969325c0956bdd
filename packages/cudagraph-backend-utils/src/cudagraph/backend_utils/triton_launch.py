"""Bound Triton launches: a Triton kernel launched without Triton's JIT call on the hot path, for the eager breaks of
a breakable graph and for eager steps.

Triton's JIT call (``kernel[grid](*args)``) binds every argument, works out its specialization and looks the
compiled kernel up on every launch: about 60 µs of host time a launch on the H100 machine's host (10 ms for the
reference engine's eager batch-1 decode step of 174 launches, against 1 ms of GPU time). Two ways around it, for
any ``@triton.jit`` kernel whose constexprs are its trailing parameters:

- ``FastLauncher(kernel)(grid, args, constexprs, num_warps)`` keys the compiled kernels itself, on what Triton
  specializes a launch on (``launch_values_and_key``: each tensor's dtype and 16-byte alignment, each integer's
  equality to 1, divisibility by 16 and width, each other argument's type), compiles through the JIT once per key,
  and then calls the compiled kernel's C launcher: for launches whose tensors change from call to call.
- ``FastLauncher.bind(...)`` (or ``direct_launch``) takes every argument once and returns a zero-argument callable
  that only asks for the current stream and calls the launcher: for tensors that keep their addresses, as a
  breakable graph's static buffers do. A break op's ``ReplayBinder`` (``register_break_op(op, replay_binder=...)``)
  returns it, so a replayed break is one C call.

The shortcut calls the C entry point of Triton's compiled launcher with the argument layout of the Triton releases
it was proven on (``NATIVE_LAUNCH_VERSIONS``: 3.6.x). Everywhere else a launch goes through Triton's own path, with
the same result: the JIT call on any other Triton release, under Triton's interpreter (``TRITON_INTERPRET=1``, the
CPU tests), for a compiled kernel that needs scratch memory, while Triton's launch hooks are set (a profiler reads
them), inside ``through_jit()``, and for a kernel whose constexprs are not its trailing parameters.

Programmatic dependent launch: ``launch_pdl=True`` (a keyword of ``FastLauncher.__call__``, ``bind`` and
``direct_launch``) compiles the kernel with Triton's ``launch_pdl`` option (Triton 3.4+), whose launcher then sets
CUDA's programmatic-stream-serialization attribute on every launch, the JIT call's as well as the C launcher's: the
kernel may start while the kernel before it on the stream finishes, and must itself wait for it
(``tl.extra.cuda.gdc_wait()``) before it reads what that kernel wrote. The flag is part of the key a compiled kernel
is kept under; with ``False`` (the default) nothing is passed, so any Triton release launches as before.

Without Triton this module imports all the same (it imports Triton on first use, never at import): ``cdiv``,
``next_power_of_2``, ``through_jit`` and ``launch_values_and_key`` work, a ``FastLauncher`` launches every call
through ``kernel[grid](...)`` and ``bind`` binds that call, and ``direct_launch`` returns None. It never allocates,
synchronizes or captures anything itself.

Example (the package README's, run on CPU under ``TRITON_INTERPRET=1`` by the tests and through the C launcher on a
CUDA device by the GPU tests)::

    import torch
    import triton
    import triton.language as tl

    from cudagraph.backend_utils import FastLauncher


    @triton.jit
    def scale_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * factor, mask=mask)


    launch_scale = FastLauncher(scale_kernel)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: under TRITON_INTERPRET=1, through the JIT call
    x = torch.randn(5000, device=device)
    out = torch.empty_like(x)
    grid = (triton.cdiv(x.numel(), 1024),)
    launch_scale(grid, (x, out, x.numel(), 2.0), {"BLOCK": 1024}, num_warps=4)
    torch.testing.assert_close(out, 2 * x)

    # Bound once (what a break's replay binder returns): each call only reads the current stream and launches.
    triple_x = launch_scale.bind(grid, (x, out, x.numel(), 3.0), {"BLOCK": 1024}, num_warps=4)
    triple_x()
    torch.testing.assert_close(out, 3 * x)
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

__all__ = [
    "NATIVE_LAUNCH_VERSIONS",
    "FastLauncher",
    "cdiv",
    "direct_launch",
    "launch_values_and_key",
    "next_power_of_2",
    "through_jit",
]

_LOG = logging.getLogger(__name__)

NATIVE_LAUNCH_VERSIONS = ("3.6.",)
"""Triton releases (version prefixes) whose compiled launcher's C entry point takes the argument layout used here
(grid, stream, function, cooperative and PDL flags, two scratch buffers, packed metadata, launch metadata, two hooks,
then the kernel's arguments in signature order) and whose specialization ``launch_values_and_key`` mirrors. Proven on
Triton 3.6.0 (H100, torch 2.11); any other release launches through the JIT call."""

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


@functools.cache
def _triton() -> Any | None:
    """The ``triton`` module, imported on first use (importing this package never imports Triton, which reads
    ``TRITON_INTERPRET`` once, when it is first imported), or None where Triton is not installed."""
    try:
        import triton
    except ImportError:
        return None
    return triton


def _proven_triton() -> bool:
    """Whether the installed Triton is one of ``NATIVE_LAUNCH_VERSIONS`` (read at each bind, not at import)."""
    triton = _triton()
    return triton is not None and str(getattr(triton, "__version__", "")).startswith(NATIVE_LAUNCH_VERSIONS)


@functools.cache
def _runtime_knobs() -> Any | None:
    """Triton's runtime settings, where its launch hooks are set (None without Triton or on one without ``knobs``:
    then hooks cannot be read, and launches go through the JIT call)."""
    return getattr(getattr(_triton(), "knobs", None), "runtime", None)


@functools.cache
def _interpreted_types() -> tuple[type, ...]:
    """The kernel type of Triton's interpreter (``TRITON_INTERPRET=1``): launched on CPU tensors, through its JIT
    call."""
    if _triton() is None:
        return ()
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return ()
    return (InterpretedFunction,)


def _hooked(hook: object) -> bool:
    """Whether a Triton launch hook is set: a callable, or a chain of them (Triton 3.5+) that is not empty."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _launch_hooks_set(runtime: Any) -> bool:
    """Whether a launch must go through Triton's path because launch hooks are (or may be) set on ``runtime``."""
    return runtime is None or _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook)


def _launch_prefix(function: int, cooperative: int, pdl: int, metadata: Any) -> tuple[Any, ...]:
    """What the C launcher takes between the stream and the kernel's arguments: the function, the cooperative-grid
    and PDL flags, no global or profile scratch, the packed metadata, no launch metadata and no hooks."""
    return (function, cooperative, pdl, None, None, metadata, None, None, None)


@dataclass(frozen=True)
class _CompiledLaunch:
    """A compiled kernel's C launcher and what it takes besides the grid, the stream and the runtime arguments."""

    c_launch: Callable[..., None]
    prefix: tuple[Any, ...]
    """``_launch_prefix`` of the compiled kernel."""
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
    if not _proven_triton():
        return None
    c_launch = getattr(launcher, "launch", None)
    flags = (getattr(launcher, "launch_cooperative_grid", None), getattr(launcher, "launch_pdl", None))
    scratch = (getattr(launcher, "global_scratch_size", None), getattr(launcher, "profile_scratch_size", None))
    if not callable(c_launch) or None in flags or scratch != (0, 0):
        return None
    return c_launch, int(flags[0]), int(flags[1])  # type: ignore[arg-type]


def _options(launch_pdl: bool) -> dict[str, Any]:
    """The Triton compile options besides ``num_warps`` a launch passes: ``launch_pdl`` only where it is asked for
    (a Triton older than 3.4 knows no such option)."""
    return {"launch_pdl": True} if launch_pdl else {}


def _compile(
    kernel: Any,
    grid: tuple[int, ...],
    args: tuple[Any, ...],
    constexprs: dict[str, Any],
    num_warps: int,
    launch_pdl: bool = False,
) -> Any:
    """``kernel``'s compiled kernel for these arguments (compiled now, or found in Triton's caches)."""
    compiled = kernel.warmup(*args, grid=grid, **constexprs, num_warps=num_warps, **_options(launch_pdl))
    return compiled.result() if hasattr(compiled, "result") else compiled


def _current_stream_getter() -> Callable[[int], int]:
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw  # type: ignore[no-any-return]
    return lambda device_index: torch.cuda.current_stream(device_index).cuda_stream


_current_raw_stream = _current_stream_getter()
"""CUDA device index -> the current stream's handle: torch's direct call where it has one (what Triton's own launch
path uses), with no ``Stream`` object made per launch."""

_current_device: Callable[[], int] = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
"""The current CUDA device's index (the device Triton's JIT launches on)."""


class _JitSwitch(threading.local):
    on = False


_THROUGH_JIT = _JitSwitch()


@contextlib.contextmanager
def through_jit() -> Iterator[None]:
    """Inside the block, every ``FastLauncher`` call in this thread launches through Triton's JIT call (to compare
    against Triton's own path, or to time it: ``bench/bench_launch.py``). Launches bound before are unchanged."""
    before, _THROUGH_JIT.on = _THROUGH_JIT.on, True
    try:
        yield
    finally:
        _THROUGH_JIT.on = before


class FastLauncher:
    """``kernel[grid](*args, **constexprs, num_warps=...)`` without the JIT call's per-launch work (see the module).

    Call it with the runtime arguments in the kernel's signature order and the constexprs by name; every constexpr
    follows the runtime arguments in the kernel's signature (a kernel declared otherwise always launches through the
    JIT). Compiled kernels are kept per specialization for the launcher's lifetime: make one launcher per kernel, at
    import, not one per call. Launches on the current CUDA device and stream, as the JIT call does.
    """

    __slots__ = ("_compiled", "_runtime", "jit_only", "kernel")

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        """The ``@triton.jit`` kernel (or anything launched as ``kernel[grid](*args, **kwargs)``)."""
        self.jit_only: bool = (
            isinstance(kernel, _interpreted_types()) or not hasattr(kernel, "warmup") or not _proven_triton()
        )
        """Every launch goes through the JIT call: Triton's interpreter, no Triton, or a Triton release outside
        ``NATIVE_LAUNCH_VERSIONS``."""
        self._runtime = _runtime_knobs()
        self._compiled: dict[Hashable, _CompiledLaunch | None] = {}

    def __call__(
        self,
        grid: tuple[int, ...],
        args: tuple[Any, ...],
        constexprs: dict[str, Any],
        num_warps: int = 4,
        *,
        launch_pdl: bool = False,
    ) -> None:
        """Launch ``kernel`` over ``grid`` on the current stream (with ``launch_pdl``, as a programmatic dependent
        launch: see the module)."""
        if self.jit_only or _THROUGH_JIT.on or _launch_hooks_set(self._runtime):
            self.kernel[grid](*args, **constexprs, num_warps=num_warps, **_options(launch_pdl))
            return
        device = _current_device()
        values, specialization = launch_values_and_key(args)
        frozen = (device, num_warps, launch_pdl, *constexprs.items(), *specialization)
        try:
            compiled = self._compiled[frozen]
        except KeyError:
            compiled = self._compiled[frozen] = self._native(grid, args, constexprs, num_warps, launch_pdl)
        if compiled is None:
            self.kernel[grid](*args, **constexprs, num_warps=num_warps, **_options(launch_pdl))
            return
        compiled.launch(grid, _current_raw_stream(device), values)

    def _native(
        self,
        grid: tuple[int, ...],
        args: tuple[Any, ...],
        constexprs: dict[str, Any],
        num_warps: int,
        launch_pdl: bool = False,
    ) -> _CompiledLaunch | None:
        """The C launch of these arguments' compiled kernel, or None where it must go through the JIT."""
        names = list(self.kernel.arg_names)
        if sorted(names[len(args) :]) != sorted(constexprs):
            _LOG.debug("%s: constexprs are not the trailing parameters; launching through the JIT", self.kernel)
            return None
        compiled = _compile(self.kernel, grid, args, constexprs, num_warps, launch_pdl)
        native = _native_launch(getattr(compiled, "run", None))
        if native is None:
            return None
        c_launch, cooperative, pdl = native
        tail = tuple(constexprs[name] for name in names[len(args) :])
        return _CompiledLaunch(
            c_launch, _launch_prefix(compiled.function, cooperative, pdl, compiled.packed_metadata), tail
        )

    def bind(
        self,
        grid: tuple[int, ...],
        args: tuple[Any, ...],
        constexprs: dict[str, Any],
        num_warps: int = 4,
        *,
        launch_pdl: bool = False,
    ) -> Callable[[], None]:
        """The launch with every argument taken now (``direct_launch``), or the JIT call with them bound where that
        is unavailable (``jit_only``, or ``direct_launch`` gave None): for tensors that keep their addresses."""
        if not self.jit_only:
            direct = direct_launch(self.kernel, grid, args, constexprs, num_warps, launch_pdl=launch_pdl)
            if direct is not None:
                return direct
        return functools.partial(self.kernel[grid], *args, **constexprs, num_warps=num_warps, **_options(launch_pdl))


def direct_launch(
    kernel: Any,
    grid: tuple[int, ...],
    args: tuple[Any, ...],
    constexprs: dict[str, Any],
    num_warps: int,
    *,
    launch_pdl: bool = False,
) -> Callable[[], None] | None:
    """``kernel[grid](*args, **constexprs, num_warps=num_warps)`` compiled now and bound to its launcher, or None
    where Triton is absent or this Triton's compiled kernels lack the launch API used here (the caller then
    launches through the JIT call; ``FastLauncher.bind`` does).

    Each launch only asks for the current stream and calls the compiled kernel's launcher, with the tensors passed
    as the device addresses they have now (no pointer check per launch either): for tensors that stay where they are
    (a breakable graph's static buffers and views). On a Triton of ``NATIVE_LAUNCH_VERSIONS`` and a kernel that
    needs no scratch memory it calls the launcher's C entry point itself, skipping the launcher's Python frame and
    its per-launch scratch lookups; otherwise it calls the launcher's Python ``__call__``. Where Triton's launch
    hooks are set when it binds (a profiler), launches go through the compiled kernel's own runner, which calls
    them."""
    if _triton() is None:
        return None
    try:
        compiled = _compile(kernel, grid, args, constexprs, num_warps, launch_pdl)
        runner = compiled[grid]
        launcher, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    except (AttributeError, TypeError) as error:
        _LOG.debug("launching %s through the JIT: %s", getattr(kernel, "__name__", kernel), error)
        return None
    values = {**dict(zip(kernel.arg_names, args, strict=False)), **constexprs}
    bound = tuple(v.data_ptr() if isinstance(v, torch.Tensor) else v for v in (values[n] for n in kernel.arg_names))
    if _launch_hooks_set(_runtime_knobs()):
        return functools.partial(runner, *bound)
    device = next(arg.device for arg in args if isinstance(arg, torch.Tensor))
    current_stream = functools.partial(_current_raw_stream, device.index)
    grid_x, grid_y, grid_z = (*grid, 1, 1)[:3]
    native = _native_launch(launcher)
    if native is not None:
        c_launch, cooperative, pdl = native
        after_stream = (*_launch_prefix(function, cooperative, pdl, metadata), *bound)

        def launch_native() -> None:
            c_launch(grid_x, grid_y, grid_z, current_stream(), *after_stream)

        return launch_native

    def launch() -> None:
        launcher(grid_x, grid_y, grid_z, current_stream(), function, metadata, None, None, None, *bound)

    return launch
