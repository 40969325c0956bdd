"""Attention backends over the paged KV cache and the registered attention operator the model calls.

``torch`` runs anywhere; ``flashinfer`` needs the optional ``flashinfer-python`` package and a CUDA device; ``triton``
(decode and extend in one Triton kernel a layer each) needs Triton, which CUDA builds of torch ship with.
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


def _optional_backend(
    name: str, module_name: str, class_name: str, packages: tuple[str, ...], needs: str
) -> Callable[..., Any]:
    """The factory of an attention backend on an optional dependency: ``module_name`` is imported only when the
    backend is asked for, so the engine works without it; a missing module of ``packages`` is one
    ``AttentionBackendUnavailableError`` saying what the backend ``needs`` (``{missing}``: the missing module)."""

    def make(req_to_token_pool: ReqToTokenPool, kv_pool: TokenToKVPool, shape: Any) -> Any:
        try:
            module = importlib.import_module(module_name, __name__)
        except ModuleNotFoundError as error:
            if error.name is None or error.name.split(".")[0] not in packages:
                raise
            raise AttentionBackendUnavailableError(
                f"the {name} attention backend needs {needs.format(missing=error.name)}: "
                f"pip install 'cudagraph-engine[{name}]', or use --attention-backend torch"
            ) from None
        return getattr(module, class_name)(
            req_to_token_pool, kv_pool, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.attention_scale
        )

    return make


class AttentionBackendUnavailableError(RuntimeError):
    """An attention backend was asked for whose optional dependency is not installed; the message names the extra."""


ATTENTION_BACKENDS: dict[str, Callable[..., Any]] = {
    "torch": _torch_backend,
    "flashinfer": _optional_backend(
        "flashinfer",
        ".flashinfer_backend",
        "FlashInferAttentionBackend",
        ("flashinfer", "tvm_ffi"),
        "the flashinfer-python package ({missing} is not installed)",
    ),
    "triton": _optional_backend(
        "triton",
        ".triton_backend",
        "TritonAttentionBackend",
        ("triton",),
        "the triton package (CUDA builds of torch ship it)",
    ),
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
