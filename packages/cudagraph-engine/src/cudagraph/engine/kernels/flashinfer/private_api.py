"""Every read, and the one write, of FlashInfer's private attributes: one adapter, with the releases it was proven on.

FlashInfer's public API has no way to launch a planned decode kernel without ``run``'s per-call work, nor to give a
wrapper a pinned host workspace that outlives it. The engine needs both (the bound breaks of
``kernels.flashinfer.decode_attention``, the FlashInfer backend's shared workspaces), so it reads a paged decode
wrapper's private attributes and FlashInfer's private helpers, here and nowhere else.

Proven on flashinfer-python ``PROVEN_ON`` (0.5.3); ``PROVEN_RANGE`` is ``>=0.5.3,<0.6``, the minor release proven:
FlashInfer renames private attributes between minor releases without notice, so a new minor release is outside the
range until the tests below pass on it on a GPU and the bound moves. The adapter already reads 0.7's wrapper (checked
against 0.7.4's source: ``plan`` hands its work to ``_plan_impl``, and the routes below); 0.7 joins the range once
``tests/gpu/engine/test_gpu_flashinfer_private.py`` and the FlashInfer GPU tests pass on it. What is read is the
table ``DECODE_WRAPPER_ATTRIBUTES`` (each attribute, the wrapper method that sets it, and what the engine uses it
for) and ``UTILS_HELPERS``. FlashInfer 0.7 added routes its ``run`` may take instead of the CUDA-core decode kernel
(``ROUTES_AWAY``: cuDNN chosen by ``backend="auto"``, XQA multi-token decode, per-token-head scale factors); a wrapper
whose plan took one is not bound directly (``wrapper.run`` serves it), and a 0.5 wrapper simply has none of them.

- ``tests/engine/test_engine_flashinfer_private.py`` checks, wherever flashinfer is installed, that the installed
  release is in the range and that its wrapper still sets, and ``run`` still reads, every attribute of the table;
  ``tests/gpu/engine/test_gpu_flashinfer_private.py`` reads them from a planned wrapper on the device. Each fails
  naming the attribute that moved.
- At run time a missing attribute is one ``FlashInferPrivateApiError`` naming it, the method that should have set
  it, the installed release and the proven range. The bound decode launch then falls back to the public
  ``wrapper.run`` (``kernels.flashinfer.decode_attention``); sharing the pinned workspace has no public fallback,
  so it fails.

This module never imports flashinfer at import time (``utils_helpers`` imports it on first use), so its checks run,
and are tested with stand-in wrappers, on machines without it.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType, SimpleNamespace
from typing import Any

import torch

__all__ = [
    "DECODE_WRAPPER_ATTRIBUTES",
    "PROVEN_ON",
    "PROVEN_RANGE",
    "ROUTES_AWAY",
    "UTILS_HELPERS",
    "FlashInferPrivateApiError",
    "PrivateAttribute",
    "direct_decode_launch",
    "in_proven_range",
    "read_private",
    "share_pinned_workspace",
    "utils_helpers",
]

PROVEN_ON = "0.5.3"
"""The flashinfer-python releases these reads were proven on (bound breaks equal ``wrapper.run`` on the device: 0.5.3
on an H100 and an H200 with torch 2.11)."""
PROVEN_RANGE = ">=0.5.3,<0.6"
"""The releases this adapter claims: each minor release proven, from the release proven on up to the next minor one
(excluded)."""
_PROVEN_SPANS = (((0, 5, 3), (0, 6, 0)),)
"""``PROVEN_RANGE`` as half-open ``[from, below)`` spans of ``(major, minor, patch)``."""


@dataclass(frozen=True)
class PrivateAttribute:
    """One private attribute of FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper`` the engine reads (or writes)."""

    name: str
    set_by: str
    """The wrapper method that sets it in FlashInfer 0.5.3 (so the attribute exists only after it has run)."""
    use: str
    """What the engine does with it."""


_INIT = "__init__"
_PLAN = "plan"
_DIRECT_LAUNCH = "the bound decode launch"

DECODE_WRAPPER_ATTRIBUTES: tuple[PrivateAttribute, ...] = (
    PrivateAttribute("_use_cuda_graph", _INIT, f"{_DIRECT_LAUNCH}: only a CUDA-graph wrapper is bound directly"),
    PrivateAttribute("_use_tensor_cores", _INIT, f"{_DIRECT_LAUNCH}: the tensor-core path runs another kernel"),
    PrivateAttribute("_backend", _INIT, f"{_DIRECT_LAUNCH}: only FlashInfer's fa2 kernels are bound directly"),
    PrivateAttribute("_jit_module", _INIT, f"{_DIRECT_LAUNCH}: a custom JIT module takes other arguments"),
    PrivateAttribute("_kv_layout", _INIT, f"{_DIRECT_LAUNCH}: the cache layout the launch passes"),
    PrivateAttribute("_float_workspace_buffer", _INIT, f"{_DIRECT_LAUNCH}: the kernel's float workspace"),
    PrivateAttribute("_int_workspace_buffer", _INIT, f"{_DIRECT_LAUNCH}: the kernel's int workspace"),
    PrivateAttribute("_paged_kv_indptr_buf", _INIT, f"{_DIRECT_LAUNCH}: the graph wrapper's static indptr"),
    PrivateAttribute("_paged_kv_indices_buf", _INIT, f"{_DIRECT_LAUNCH}: the graph wrapper's static page ids"),
    PrivateAttribute("_paged_kv_last_page_len_buf", _INIT, f"{_DIRECT_LAUNCH}: the static last-page lengths"),
    PrivateAttribute(
        "_pin_memory_int_workspace_buffer", _INIT, "the pinned host workspace plans stage in, swapped for a shared one"
    ),
    PrivateAttribute("_cached_module", _PLAN, f"{_DIRECT_LAUNCH}: the loaded kernel module whose run it calls"),
    PrivateAttribute("_plan_info", _PLAN, f"{_DIRECT_LAUNCH}: the current plan, read at every launch"),
    PrivateAttribute("_cached_q_data_type", _PLAN, f"{_DIRECT_LAUNCH}: the query dtype the plan was made for"),
    PrivateAttribute("_cached_kv_data_type", _PLAN, f"{_DIRECT_LAUNCH}: the cache dtype the plan was made for"),
    PrivateAttribute("_window_left", _PLAN, f"{_DIRECT_LAUNCH}: the sliding window"),
    PrivateAttribute("_logits_soft_cap", _PLAN, f"{_DIRECT_LAUNCH}: the logits soft cap"),
    PrivateAttribute("_sm_scale", _PLAN, f"{_DIRECT_LAUNCH}: the softmax scale"),
    PrivateAttribute("_rope_scale", _PLAN, f"{_DIRECT_LAUNCH}: the rope scale the kernel takes"),
    PrivateAttribute("_rope_theta", _PLAN, f"{_DIRECT_LAUNCH}: the rope theta the kernel takes"),
)
"""Every private attribute of a paged decode wrapper this module touches, in the order the checks name them."""

_BY_NAME: Mapping[str, PrivateAttribute] = MappingProxyType({attr.name: attr for attr in DECODE_WRAPPER_ATTRIBUTES})

PINNED_WORKSPACE = "_pin_memory_int_workspace_buffer"
"""The one attribute this module writes (``share_pinned_workspace``)."""

UTILS_HELPERS = ("TensorLayout", "_unpack_paged_kv_cache", "_get_cache_alibi_slopes_buf", "device_support_pdl")
"""What the bound decode launch takes from ``flashinfer.utils`` (the two ``_`` ones are private)."""

_DIRECT_LAUNCH_ATTRIBUTES = tuple(attr.name for attr in DECODE_WRAPPER_ATTRIBUTES if attr.name != PINNED_WORKSPACE)

ROUTES_AWAY: tuple[PrivateAttribute, ...] = (
    PrivateAttribute("_cudnn_auto", _PLAN, "true when backend='auto' picked cuDNN: run launches cuDNN's graph"),
    PrivateAttribute("_use_xqa_mtp_decode", _PLAN, "true when run takes XQA's multi-token decode"),
    PrivateAttribute("_use_token_head_sf", _PLAN, "true when the cache carries per-token-head scale factors"),
)
"""Switches FlashInfer 0.7's decode wrapper sets (0.5 has none of them): any one true, and ``run`` does not launch the
CUDA-core decode kernel the bound launch mirrors, so the wrapper is not bound directly."""

_DEFAULT_ROPE_SCALE = 1.0
_DEFAULT_ROPE_THETA = 1e4
"""What ``run`` passes when the plan set no rope scale or theta (the kernels take them even without rope)."""


class FlashInferPrivateApiError(RuntimeError):
    """A private attribute or helper of FlashInfer this engine reads is not where FlashInfer 0.5.3 and 0.7 have it: the
    message names it, the method that should have set it, the installed release and ``PROVEN_RANGE``."""


def parse_version(version: str) -> tuple[int, int, int] | None:
    """``(major, minor, patch)`` of a release string like ``0.5.3`` or ``0.6.0rc1+cu130``; ``None`` if unreadable."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def in_proven_range(version: str) -> bool:
    """Whether flashinfer-python ``version`` is in ``PROVEN_RANGE``."""
    parsed = parse_version(version)
    return parsed is not None and any(start <= parsed < below for start, below in _PROVEN_SPANS)


def installed_version() -> str:
    """The installed flashinfer's ``__version__`` (``"unknown"`` when it has none or is not importable)."""
    try:
        import flashinfer
    except ImportError:
        return "unknown"
    return str(getattr(flashinfer, "__version__", "unknown"))


def _release_note() -> str:
    version = installed_version()
    where = "inside" if in_proven_range(version) else "outside"
    return (
        f"flashinfer {version} is installed, {where} the range these reads were proven on ({PROVEN_RANGE}, proven on "
        f"{PROVEN_ON}); see cudagraph.engine.kernels.flashinfer.private_api"
    )


def _missing_message(owner: object, names: Iterable[str]) -> str:
    missing = list(names)
    described = []
    for name in missing:
        attr = _BY_NAME.get(name)
        if attr is None:
            described.append(name)
        elif attr.set_by == _PLAN:
            described.append(f"{name} (set by plan(): plan the wrapper before binding it; used for {attr.use})")
        else:
            described.append(f"{name} (set by {attr.set_by}; used for {attr.use})")
    kind = type(owner).__name__
    return f"FlashInfer's {kind} has no {', '.join(described)}: {_release_note()}"


def read_private(wrapper: object, names: Iterable[str]) -> dict[str, Any]:
    """The private attributes ``names`` of ``wrapper`` (read from its instance ``__dict__``, as FlashInfer sets
    them), or one ``FlashInferPrivateApiError`` naming every one that is missing."""
    settings = vars(wrapper)
    wanted = list(names)
    missing = [name for name in wanted if name not in settings]
    if missing:
        raise FlashInferPrivateApiError(_missing_message(wrapper, missing))
    return {name: settings[name] for name in wanted}


def share_pinned_workspace(wrapper: object, pinned: torch.Tensor) -> None:
    """Give ``wrapper`` the pinned host workspace ``pinned`` (shared by every wrapper, never freed) in place of the
    one ``reset_workspace_buffer`` just made, before any plan has used it.

    Raises ``FlashInferPrivateApiError`` when the wrapper has no such attribute: setting it anyway would do nothing,
    and the wrapper's own pinned buffer, freed with the wrapper, is what this exists to avoid (why: the FlashInfer
    backend's ``_share_workspace``)."""
    read_private(wrapper, [PINNED_WORKSPACE])
    setattr(wrapper, PINNED_WORKSPACE, pinned)


@functools.cache
def utils_helpers() -> SimpleNamespace:
    """``UTILS_HELPERS`` from ``flashinfer.utils``, or one ``FlashInferPrivateApiError`` naming the missing ones."""
    import flashinfer.utils

    missing = [name for name in UTILS_HELPERS if not hasattr(flashinfer.utils, name)]
    if missing:
        raise FlashInferPrivateApiError(f"flashinfer.utils has no {', '.join(missing)}: {_release_note()}")
    return SimpleNamespace(**{name: getattr(flashinfer.utils, name) for name in UTILS_HELPERS})


def direct_decode_launch(
    wrapper: object, q: torch.Tensor, paged_kv_cache: torch.Tensor, out: torch.Tensor
) -> Callable[[], None] | None:
    """``wrapper.run(q, paged_kv_cache, out=out)`` as a zero-argument call of the kernel FlashInfer's ``run`` would
    launch, with everything but the plan info bound now (the plan info is read at every call: ``plan`` replaces it
    before every replay). Bind after ``plan``.

    ``None`` when the wrapper is not the plain configuration whose ``run`` this mirrors (a CUDA-graph wrapper, CUDA
    cores, fa2 kernels, no custom JIT module, NHD layout, none of ``ROUTES_AWAY``) or the tensors do not match its
    plan: the caller uses
    ``run``. ``FlashInferPrivateApiError`` when an attribute or helper this reads is missing (another FlashInfer).
    """
    if not isinstance(paged_kv_cache, torch.Tensor):
        return None
    settings = read_private(wrapper, _DIRECT_LAUNCH_ATTRIBUTES)
    if any(vars(wrapper).get(route.name) for route in ROUTES_AWAY):
        return None
    helpers = utils_helpers()
    plainly_configured = (
        settings["_use_cuda_graph"] is True
        and settings["_use_tensor_cores"] is False
        and settings["_backend"] in ("auto", "fa2")
        and settings["_jit_module"] is None
        and settings["_kv_layout"] == "NHD"
        and settings["_cached_module"] is not None
    )
    if not plainly_configured:
        return None
    k_cache, v_cache = helpers._unpack_paged_kv_cache(paged_kv_cache, "NHD")
    if (
        q.dtype != settings["_cached_q_data_type"]
        or k_cache.dtype != settings["_cached_kv_data_type"]
        or out.shape != q.shape
        or out.dtype != q.dtype
        or out.device != q.device
    ):
        return None
    sm_scale = settings["_sm_scale"]
    rope_scale, rope_theta, soft_cap = settings["_rope_scale"], settings["_rope_theta"], settings["_logits_soft_cap"]
    float_workspace, int_workspace = settings["_float_workspace_buffer"], settings["_int_workspace_buffer"]
    launch_args = (
        q,
        k_cache,
        v_cache,
        settings["_paged_kv_indptr_buf"],
        settings["_paged_kv_indices_buf"],
        settings["_paged_kv_last_page_len_buf"],
        out,
        None,  # no log-sum-exp
        helpers.TensorLayout.NHD.value,
        settings["_window_left"],
        helpers.device_support_pdl(q.device),
        helpers._get_cache_alibi_slopes_buf(q.shape[1], q.device),
        soft_cap if soft_cap is not None else 0.0,
        sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1]),
        rope_scale if rope_scale is not None else _DEFAULT_ROPE_SCALE,
        rope_theta if rope_theta is not None else _DEFAULT_ROPE_THETA,
    )
    kernel = settings["_cached_module"].run

    def launch() -> None:
        kernel(float_workspace, int_workspace, wrapper._plan_info, *launch_args)  # type: ignore[attr-defined]

    return launch
