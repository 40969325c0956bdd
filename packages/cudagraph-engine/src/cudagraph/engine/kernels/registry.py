"""Which kernel set a model computes through: the registry (name -> requirements and factory) and the choice.

``select_kernels(name, target)`` is the one entry. ``torch`` runs everywhere. ``flashinfer`` needs the optional
``flashinfer-python`` package and the conditions in its row (a CUDA device, a half-precision dtype, a head size its
rotary kernel is built for, a forward that ``torch.compile`` does not trace). ``triton`` needs Triton (part of every
CUDA build of torch) and a CUDA device; it runs every dtype and head size the model has, and a forward that
``torch.compile`` traces (``tc_piecewise``, compiled small buckets) calls its operations as custom ops
(``triton.traced_ops``), so ``auto`` picks it there too.
``auto`` takes the first row of ``AUTO_ORDER`` whose conditions hold and whose package imports, and logs why it
passed over the others. Asking for a set by name that cannot run is one error: the missing package (naming the extra
that installs it), else the first condition that fails, and what to use instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

import torch

from ..optional_import import import_optional
from .layer_set import TORCH_KERNELS, LayerKernels

if TYPE_CHECKING:
    from ..model.architecture import ModelConfig

logger = logging.getLogger(__name__)

AUTO = "auto"
"""The choice that picks the fastest set this model can use here."""


class KernelBackendError(ValueError):
    """A kernel set that cannot run this model here: the message names the failed condition and the alternative."""


class KernelBackendUnavailableError(KernelBackendError):
    """A kernel set was asked for whose optional dependency is not installed; the message names the extra."""


@dataclass(frozen=True)
class KernelTarget:
    """What a kernel set must run: the model's shape, its dtype and device, and whether ``torch.compile`` traces its
    forward (the ``tc_piecewise`` backend does)."""

    config: ModelConfig
    dtype: torch.dtype
    device: torch.device
    traced: bool = False


@dataclass(frozen=True)
class Requirement:
    """One condition a kernel set needs: ``holds(target)``, what it asks for, and what ``target`` has instead."""

    needs: str
    holds: Callable[[KernelTarget], bool]
    found: Callable[[KernelTarget], str]


KernelFactory = Callable[[KernelTarget], LayerKernels]
"""Builds (and warms up) a kernel set for a target that meets its conditions."""


@dataclass(frozen=True)
class KernelBackend:
    """A registry row: the set's name, its conditions, and ``load()``, which imports what the set needs (raising
    ``KernelBackendUnavailableError`` when ``package`` is missing: ``optional_import.import_optional``) and returns
    its factory."""

    name: str
    requirements: tuple[Requirement, ...]
    load: Callable[[], KernelFactory]
    package: str | None = None
    """The optional distribution the set imports, named in the error when it is missing."""

    def unmet(self, target: KernelTarget) -> Requirement | None:
        """The first condition ``target`` fails, or ``None``."""
        return next((requirement for requirement in self.requirements if not requirement.holds(target)), None)


FLASHINFER_DTYPES = (torch.float16, torch.bfloat16)
"""The activation dtypes FlashInfer's norm, rotary and activation kernels are built for."""
FLASHINFER_HEAD_DIMS = (64, 128, 256, 512)
"""The head sizes FlashInfer's rotary kernel is built for."""
FLASHINFER_VECTOR_BYTES = 16
"""``silu_and_mul`` moves 16-byte vectors: a row of gate (or up) must be whole vectors."""

CUDA_DEVICE = Requirement("a CUDA device", lambda t: t.device.type == "cuda", lambda t: f"the model is on {t.device}")
"""The condition every fused set has: its kernels are CUDA kernels."""


def untraced(why: str) -> Requirement:
    """The condition of a set whose kernels dynamo cannot trace (``why``): a forward ``torch.compile`` does not
    compile."""
    return Requirement(
        f"a forward that torch.compile does not trace ({why})",
        lambda t: not t.traced,
        lambda _: "a phase uses the tc_piecewise backend, which compiles the forward",
    )


FLASHINFER_REQUIREMENTS = (
    CUDA_DEVICE,
    Requirement(
        "float16 or bfloat16",
        lambda t: t.dtype in FLASHINFER_DTYPES,
        lambda t: f"the model computes in {str(t.dtype).removeprefix('torch.')}",
    ),
    Requirement(
        f"head_dim in {FLASHINFER_HEAD_DIMS}",
        lambda t: t.config.head_dim in FLASHINFER_HEAD_DIMS,
        lambda t: f"head_dim is {t.config.head_dim}",
    ),
    Requirement(
        f"intermediate_size * dtype size a multiple of {FLASHINFER_VECTOR_BYTES} bytes",
        lambda t: t.config.intermediate_size * t.dtype.itemsize % FLASHINFER_VECTOR_BYTES == 0,
        lambda t: f"intermediate_size is {t.config.intermediate_size}",
    ),
    untraced("FlashInfer's kernels are not registered torch ops, so dynamo cannot trace them"),
)
"""The flashinfer row's conditions, checked in order (the first failing one is reported)."""


TRITON_REQUIREMENTS = (CUDA_DEVICE,)
"""The triton row's conditions, checked in order. A traced forward is not one of them: dynamo traces each operation
of the set as its custom op (``triton.traced_ops``)."""


def _load_torch() -> KernelFactory:
    return lambda target: TORCH_KERNELS


def _fused_set_loader(
    name: str, package: str, provided_by: tuple[str, ...], module_name: str, class_name: str
) -> Callable[[], KernelFactory]:
    """``load`` of a fused set: import ``module_name`` (on the optional ``package``, imported only when the set is
    chosen, so the engine works without it; ``import_optional`` turns its absence into one
    ``KernelBackendUnavailableError``) and build ``class_name`` from it, warmed up for the target."""

    def unavailable(missing: str) -> KernelBackendUnavailableError:
        return KernelBackendUnavailableError(
            f"the {name} kernels need the {package} package ({missing} is not installed): "
            f"pip install 'cudagraph-engine[{name}]', or use --kernel-backend torch"
        )

    def load() -> KernelFactory:
        module = import_optional(module_name, __package__, provided_by=provided_by, unavailable=unavailable)

        def build(target: KernelTarget) -> LayerKernels:
            kernels = getattr(module, class_name)()
            module.warm_up(kernels, target.config, target.dtype, target.device)
            return kernels  # type: ignore[no-any-return]

        return build

    return load


KERNEL_BACKENDS: Mapping[str, KernelBackend] = MappingProxyType(
    {
        "torch": KernelBackend("torch", (), _load_torch),
        "flashinfer": KernelBackend(
            "flashinfer",
            FLASHINFER_REQUIREMENTS,
            _fused_set_loader(
                "flashinfer",
                "flashinfer-python",
                ("flashinfer", "tvm_ffi"),
                ".flashinfer.layer_set",
                "FlashInferKernels",
            ),
            "flashinfer-python",
        ),
        "triton": KernelBackend(
            "triton",
            TRITON_REQUIREMENTS,
            _fused_set_loader("triton", "triton", ("triton",), ".triton.layer_set", "TritonKernels"),
            "triton",
        ),
    }
)
"""Kernel set name -> registry row."""

AUTO_ORDER = ("triton", "flashinfer", "torch")
"""What ``auto`` tries, fastest first; the last row has no conditions, so ``auto`` always finds one."""

KERNEL_BACKEND_CHOICES = (AUTO, *KERNEL_BACKENDS)
"""Every accepted name (the CLI's ``--kernel-backend`` choices)."""


def select_kernels(name: str, target: KernelTarget) -> LayerKernels:
    """The kernel set ``name`` (``auto`` or a ``KERNEL_BACKENDS`` key) for ``target``, built and warmed up.

    Raises ``KernelBackendUnavailableError`` when a named set's package is missing and ``KernelBackendError`` when
    the name is unknown or one of its conditions fails; ``auto`` never raises for those, it falls back.
    """
    if name == AUTO:
        return _select_auto(target)
    return _named_factory(name, target)(target)


def check_kernel_backend(name: str, target: KernelTarget) -> None:
    """Raise what ``select_kernels(name, target)`` would raise, without building or warming anything up: a command
    checks its choice with this before any weight is read. ``auto`` always passes (it falls back)."""
    if name != AUTO:
        _named_factory(name, target)


def _named_factory(name: str, target: KernelTarget) -> KernelFactory:
    backend = KERNEL_BACKENDS.get(name)
    if backend is None:
        raise KernelBackendError(f"unknown kernel backend {name!r}; choose one of {', '.join(KERNEL_BACKEND_CHOICES)}")
    factory = backend.load()
    unmet = backend.unmet(target)
    if unmet is not None:
        raise KernelBackendError(
            f"the {name} kernels need {unmet.needs}, but {unmet.found(target)}: use --kernel-backend torch or auto"
        )
    return factory


def _select_auto(target: KernelTarget) -> LayerKernels:
    passed_over: list[str] = []
    for name in AUTO_ORDER:
        backend = KERNEL_BACKENDS[name]
        unmet = backend.unmet(target)
        if unmet is not None:
            passed_over.append(f"{name} needs {unmet.needs}, but {unmet.found(target)}")
            continue
        try:
            factory = backend.load()
        except KernelBackendUnavailableError:
            passed_over.append(f"{name} needs the {backend.package} package, which is not installed")
            continue
        kernels = factory(target)
        reasons = f" ({'; '.join(passed_over)})" if passed_over else ""
        logger.info("kernel backend auto: %s%s", name, reasons)
        return kernels
    raise AssertionError(f"AUTO_ORDER ends with a row that has no conditions: {AUTO_ORDER}")
