"""FlashInfer's paged decode kernel called directly, for the bound breaks of a breakable replay.

``BatchDecodeWithPagedKVCacheWrapper.run`` works out on every call what cannot change between two calls of one layer
through one CUDA-graph wrapper: the cache split into keys and values, dtype and shape checks, default scales, PDL
support, the ALiBi slope buffer. ``bind_decode_run`` works it out once and returns a callable that only launches the
kernel, passing the wrapper's current plan info (``plan`` replaces it before every replay; the index buffers it fills
are the wrapper's fixed ones).

This reads private attributes of FlashInfer 0.5's wrapper (the module ``plan`` loaded, the plan info, the buffers).
Wherever the wrapper is set up in a way this binding does not cover (tensor cores, the trtllm-gen backend, a custom
JIT module, no CUDA-graph buffers, an attribute another FlashInfer version lacks), it binds ``wrapper.run`` instead,
which computes the same thing with its per-call checks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import flashinfer
import torch

try:  # private helpers of FlashInfer 0.5; without them every call goes through wrapper.run
    from flashinfer.utils import TensorLayout, _get_cache_alibi_slopes_buf, _unpack_paged_kv_cache, device_support_pdl
except ImportError:  # pragma: no cover - another FlashInfer version
    TensorLayout = None

_DEFAULT_ROPE_SCALE = 1.0
_DEFAULT_ROPE_THETA = 1e4
"""What ``run`` passes when the plan set no rope scale or theta (the kernels take them even without rope)."""


def bind_decode_run(
    wrapper: flashinfer.BatchDecodeWithPagedKVCacheWrapper,
    q: torch.Tensor,
    paged_kv_cache: torch.Tensor,
    out: torch.Tensor,
) -> Callable[[], None]:
    """``wrapper.run(q, paged_kv_cache, out=out)`` bound now: a zero-argument callable that launches FlashInfer's
    decode kernel on these tensors with the wrapper's plan at call time. Bind after ``wrapper.plan``; every later
    plan must keep the same heads, dtypes, scale and window (this engine's plans do: only the lengths change)."""
    launch = _direct_launch(wrapper, q, paged_kv_cache, out)
    if launch is None:
        return functools.partial(_run_through_wrapper, wrapper.run, q, paged_kv_cache, out)
    return launch


def _run_through_wrapper(
    run: Callable[..., Any], q: torch.Tensor, paged_kv_cache: torch.Tensor, out: torch.Tensor
) -> None:
    run(q, paged_kv_cache, out=out)


def _direct_launch(
    wrapper: flashinfer.BatchDecodeWithPagedKVCacheWrapper,
    q: torch.Tensor,
    paged_kv_cache: torch.Tensor,
    out: torch.Tensor,
) -> Callable[[], None] | None:
    """The kernel launch with everything but the plan info bound, or ``None`` when the wrapper is not the plain
    CUDA-core, NHD, CUDA-graph configuration whose ``run`` this mirrors."""
    if TensorLayout is None or not isinstance(paged_kv_cache, torch.Tensor):
        return None
    settings = vars(wrapper)
    plainly_configured = (
        settings.get("_use_cuda_graph") is True
        and settings.get("_use_tensor_cores") is False
        and settings.get("_backend") in ("auto", "fa2")
        and "_jit_module" in settings
        and settings["_jit_module"] is None
        and settings.get("_kv_layout") == "NHD"
    )
    module = settings.get("_cached_module")
    needed = ("_plan_info", "_window_left", "_logits_soft_cap", "_sm_scale", "_rope_scale", "_rope_theta")
    if not plainly_configured or module is None or not all(name in settings for name in needed):
        return None
    k_cache, v_cache = _unpack_paged_kv_cache(paged_kv_cache, "NHD")
    if (
        q.dtype != settings.get("_cached_q_data_type")
        or k_cache.dtype != settings.get("_cached_kv_data_type")
        or out.shape != q.shape
        or out.dtype != q.dtype
        or out.device != q.device
    ):
        return None
    sm_scale = wrapper._sm_scale if wrapper._sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    float_workspace, int_workspace = wrapper._float_workspace_buffer, wrapper._int_workspace_buffer
    launch_args = (
        q,
        k_cache,
        v_cache,
        wrapper._paged_kv_indptr_buf,
        wrapper._paged_kv_indices_buf,
        wrapper._paged_kv_last_page_len_buf,
        out,
        None,  # no log-sum-exp
        TensorLayout.NHD.value,
        wrapper._window_left,
        device_support_pdl(q.device),
        _get_cache_alibi_slopes_buf(q.shape[1], q.device),
        wrapper._logits_soft_cap if wrapper._logits_soft_cap is not None else 0.0,
        sm_scale,
        wrapper._rope_scale if wrapper._rope_scale is not None else _DEFAULT_ROPE_SCALE,
        wrapper._rope_theta if wrapper._rope_theta is not None else _DEFAULT_ROPE_THETA,
    )
    kernel = module.run

    def launch() -> None:
        kernel(float_workspace, int_workspace, wrapper._plan_info, *launch_args)

    return launch
