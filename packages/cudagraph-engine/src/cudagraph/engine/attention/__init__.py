"""Attention backends over the paged KV cache and the registered attention operator the model calls.

``torch`` runs anywhere; ``flashinfer`` needs the optional ``flashinfer-python`` package and a CUDA device; ``triton``
(decode in one Triton kernel a layer, extend as ``torch``) needs Triton, which CUDA builds of torch ship with.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .op import attend, unified_attention
from .torch_backend import DecodeMetadata, ExtendMetadata, TorchAttentionBackend

if TYPE_CHECKING:
    from ..kv_cache import ReqToTokenPool, TokenToKVPool


def _torch_backend(req_to_token_pool: ReqToTokenPool, kv_pool: TokenToKVPool, shape: Any) -> Any:
    return TorchAttentionBackend(
        req_to_token_pool, kv_pool, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.attention_scale
    )


def _flashinfer_backend(req_to_token_pool: ReqToTokenPool, kv_pool: TokenToKVPool, shape: Any) -> Any:
    # Optional dependency: imported only when asked for, so the engine works without it.
    try:
        module = importlib.import_module(".flashinfer_backend", __name__)
    except ModuleNotFoundError as error:
        if error.name is None or not error.name.startswith(("flashinfer", "tvm_ffi")):
            raise
        raise AttentionBackendUnavailableError(
            f"the flashinfer attention backend needs the flashinfer-python package ({error.name} is not installed): "
            "pip install 'cudagraph-engine[flashinfer]', or use --attention-backend torch"
        ) from None
    return module.FlashInferAttentionBackend(
        req_to_token_pool, kv_pool, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.attention_scale
    )


def _triton_backend(req_to_token_pool: ReqToTokenPool, kv_pool: TokenToKVPool, shape: Any) -> Any:
    try:
        module = importlib.import_module(".triton_backend", __name__)
    except ModuleNotFoundError as error:
        if error.name != "triton":
            raise
        raise AttentionBackendUnavailableError(
            "the triton attention backend needs the triton package (CUDA builds of torch ship it): "
            "pip install 'cudagraph-engine[triton]', or use --attention-backend torch"
        ) from None
    return module.TritonAttentionBackend(
        req_to_token_pool, kv_pool, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.attention_scale
    )


class AttentionBackendUnavailableError(RuntimeError):
    """An attention backend was asked for whose optional dependency is not installed; the message names the extra."""


ATTENTION_BACKENDS: dict[str, Callable[..., Any]] = {
    "torch": _torch_backend,
    "flashinfer": _flashinfer_backend,
    "triton": _triton_backend,
}
"""Attention backend name -> factory ``(req_to_token_pool, kv_pool, model_shape)``."""


def make_attention_backend(name: str, req_to_token_pool: ReqToTokenPool, kv_pool: TokenToKVPool, shape: Any) -> Any:
    """The attention backend called ``name`` for this cache and model shape."""
    factory = ATTENTION_BACKENDS.get(name)
    if factory is None:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {sorted(ATTENTION_BACKENDS)}")
    return factory(req_to_token_pool, kv_pool, shape)


__all__ = [
    "ATTENTION_BACKENDS",
    "AttentionBackendUnavailableError",
    "DecodeMetadata",
    "ExtendMetadata",
    "TorchAttentionBackend",
    "attend",
    "make_attention_backend",
    "unified_attention",
]
