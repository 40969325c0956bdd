"""FlashInfer's paged decode kernel called directly, for the bound breaks of a breakable replay.

``BatchDecodeWithPagedKVCacheWrapper.run`` works out on every call what cannot change between two calls of one layer
through one CUDA-graph wrapper: the cache split into keys and values, dtype and shape checks, default scales, PDL
support, the ALiBi slope buffer. ``bind_decode_run`` works it out once and returns a callable that only launches the
kernel, passing the wrapper's current plan info (``plan`` replaces it before every replay; the index buffers it fills
are the wrapper's fixed ones).

That launch reads FlashInfer's private attributes, which only ``private_api`` does (with the FlashInfer releases it
was proven on). Wherever the wrapper is set up in a way the launch does not cover (tensor cores, the
trtllm-gen backend, a custom JIT module, no CUDA-graph buffers), it binds ``wrapper.run`` instead, which computes the
same thing with its per-call checks; so it does where an installed FlashInfer lacks an attribute the launch reads,
and says so once, in a warning naming the attribute.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import flashinfer
import torch

from .private_api import FlashInferPrivateApiError, direct_decode_launch

logger = logging.getLogger(__name__)

_warned: set[str] = set()
"""The fallback warnings already given (one per distinct message, per process)."""


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
    """The kernel launch with everything but the plan info bound (``private_api.direct_decode_launch``), or
    ``None`` when the wrapper is not the plain CUDA-core, NHD, CUDA-graph configuration whose ``run`` it mirrors, or
    when this FlashInfer lacks a private attribute it reads (warned once)."""
    try:
        return direct_decode_launch(wrapper, q, paged_kv_cache, out)
    except FlashInferPrivateApiError as error:
        message = str(error)
        if message not in _warned:
            _warned.add(message)
            logger.warning("bound FlashInfer decode breaks go through wrapper.run (slower): %s", message)
        return None
