"""Which attention backend ``auto`` takes: the conditions of each backend (a table) and the choice, fastest first.

``AUTO_ORDER`` is Triton, then FlashInfer, then torch: on the H100 (2026-11-25) a breakable decode step at batch 1
is 2.0x full with torch attention (~80 us of host time a break), 1.15x with Triton and 1.03x with FlashInfer, and
Triton's extend attention is the one prefill ``full`` can capture. ``auto`` takes the first backend whose conditions
hold and whose package imports, and logs one INFO line naming it and why it passed over the others; torch has no
conditions, so ``auto`` always finds one (on a CPU it is torch). ``cudagraph.engine.kernels.registry`` makes the same
kind of choice for the model's kernel set. Nothing here builds a backend or touches a device.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

logger = logging.getLogger(__name__)

AUTO = "auto"
"""The choice that takes the fastest attention backend that can run here."""

AUTO_ORDER = ("triton", "flashinfer", "torch")
"""What ``auto`` tries, fastest first; the last has no conditions."""

FLASHINFER_HEAD_DIMS = (64, 128, 256, 512)
"""Head sizes FlashInfer 0.5.3 can merge split attention for (its decode planner may split whatever we ask)."""
FLASHINFER_DTYPES = (torch.float16, torch.bfloat16)
"""The cache dtypes this engine runs FlashInfer's attention in (the only ones proven on the GPU)."""


@dataclass(frozen=True)
class AttentionTarget:
    """What an attention backend must serve: where the KV cache lives, its dtype, and the model's head size."""

    device: torch.device
    dtype: torch.dtype
    head_dim: int


@dataclass(frozen=True)
class AttentionRequirement:
    """One condition of a backend: ``holds(target)``, what it asks for, and what ``target`` has instead."""

    needs: str
    holds: Callable[[AttentionTarget], bool]
    found: Callable[[AttentionTarget], str]


def triton_head_dim_fits(head_dim: int) -> bool:
    """Whether the Triton attention kernels take ``head_dim``: a power of two of at least 16 (``kernels.triton``'s
    decode and extend kernels tile the head dimension in one block)."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


_CUDA = AttentionRequirement(
    "a CUDA device", lambda t: t.device.type == "cuda", lambda t: f"the KV cache is on {t.device}"
)

ATTENTION_REQUIREMENTS: Mapping[str, tuple[AttentionRequirement, ...]] = MappingProxyType(
    {
        "triton": (
            _CUDA,
            AttentionRequirement(
                "a power-of-two head_dim of at least 16",
                lambda t: triton_head_dim_fits(t.head_dim),
                lambda t: f"head_dim is {t.head_dim}",
            ),
        ),
        "flashinfer": (
            _CUDA,
            AttentionRequirement(
                "float16 or bfloat16",
                lambda t: t.dtype in FLASHINFER_DTYPES,
                lambda t: f"the KV cache is {str(t.dtype).removeprefix('torch.')}",
            ),
            AttentionRequirement(
                f"head_dim in {FLASHINFER_HEAD_DIMS}",
                lambda t: t.head_dim in FLASHINFER_HEAD_DIMS,
                lambda t: f"head_dim is {t.head_dim}",
            ),
        ),
        "torch": (),
    }
)
"""Backend name -> the conditions ``auto`` checks before taking it, in order (the first failing one is named)."""

PACKAGES = MappingProxyType({"triton": "triton", "flashinfer": "flashinfer-python"})
"""The optional package each backend imports (named when ``auto`` passes one over for lack of it)."""


def unmet_requirement(name: str, target: AttentionTarget) -> AttentionRequirement | None:
    """The first condition of backend ``name`` that ``target`` fails, or ``None``."""
    return next((req for req in ATTENTION_REQUIREMENTS[name] if not req.holds(target)), None)


def auto_choice(target: AttentionTarget, installed: Callable[[str], bool]) -> tuple[str, list[str]]:
    """The backend ``auto`` takes for ``target`` and why it passed over each earlier one, without logging: the first
    of ``AUTO_ORDER`` whose conditions hold and whose package is ``installed(name)`` (asked only of backends that have
    one)."""
    passed_over: list[str] = []
    for name in AUTO_ORDER:
        unmet = unmet_requirement(name, target)
        if unmet is not None:
            passed_over.append(f"{name} needs {unmet.needs}, but {unmet.found(target)}")
            continue
        if name in PACKAGES and not installed(name):
            passed_over.append(f"{name} needs the {PACKAGES[name]} package, which is not installed")
            continue
        return name, passed_over
    raise AssertionError(f"AUTO_ORDER ends with a backend that has no conditions: {AUTO_ORDER}")


def choose_attention_backend(target: AttentionTarget, installed: Callable[[str], bool]) -> str:
    """The backend ``auto`` takes for ``target`` (``auto_choice``). Logs one INFO line: the backend taken and why
    each earlier one was passed over.

    Example:
        >>> import torch
        >>> from cudagraph.engine.attention.choice import AttentionTarget, choose_attention_backend
        >>> choose_attention_backend(AttentionTarget(torch.device("cpu"), torch.float32, 64), lambda name: True)
        'torch'
    """
    name, passed_over = auto_choice(target, installed)
    reasons = f" ({'; '.join(passed_over)})" if passed_over else ""
    logger.info("attention backend auto: %s%s", name, reasons)
    return name


INTERPRETERS: Mapping[str, str] = MappingProxyType({"triton": "TRITON_INTERPRET"})
"""Backend name -> the environment variable that, set to ``1``, runs its kernels on CPU tensors (slowly): asked for
by name, the backend then needs no CUDA device (``auto`` never takes it off CUDA)."""


def named_backend_problem(name: str, target: AttentionTarget, environ: Mapping[str, str]) -> str | None:
    """Why backend ``name``, asked for by name, cannot serve ``target`` (its first unmet condition, and what to use
    instead), or ``None``. Its package is not checked here (``attention.check_attention_backend`` does)."""
    for requirement in ATTENTION_REQUIREMENTS[name]:
        if requirement.holds(target):
            continue
        escape = INTERPRETERS.get(name)
        if requirement is _CUDA and escape is not None and environ.get(escape) == "1":
            continue
        hint = f" ({escape}=1 runs its kernels on CPU tensors, slowly)" if requirement is _CUDA and escape else ""
        return (
            f"the {name} attention backend needs {requirement.needs}, but {requirement.found(target)}{hint}: "
            "use --attention-backend torch or auto"
        )
    return None
