"""Attention backends over the paged KV cache and the registered attention operator the model calls.

``torch`` runs anywhere; ``flashinfer`` needs the optional ``flashinfer-python`` package and a CUDA device; ``triton``
(decode and extend in one Triton kernel a layer each) needs Triton, which CUDA builds of torch ship with. ``auto``
(the CLI's default) takes the fastest that can run here: Triton, then FlashInfer, then torch (``choice``), and logs
which one it took and why it passed over the others.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..optional_import import import_optional
from .choice import AUTO, AUTO_ORDER, AttentionTarget, auto_choice, choose_attention_backend, named_backend_problem
from .op import attend, unified_attention
from .torch_backend import DecodeMetadata, ExtendMetadata, TorchAttentionBackend

if TYPE_CHECKING:
    from ..kv_cache import ReqToTokenPool, TokenToKVPool


def _torch_backend(req_to_token_pool: ReqToTokenPool, kv_pool: TokenToKVPool, shape: Any) -> Any:
    return TorchAttentionBackend(
        req_to_token_pool, kv_pool, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.attention_scale
    )


@dataclass(frozen=True)
class _OptionalBackend:
    """The factory of an attention backend on an optional dependency: ``module_name`` is imported only when the
    backend is asked for (or ``auto`` considers it), so the engine works without it; a missing module of
    ``packages`` is one ``AttentionBackendUnavailableError`` saying what the backend ``needs`` (``{missing}``: the
    missing module)."""

    name: str
    module_name: str
    class_name: str
    packages: tuple[str, ...]
    needs: str

    def load(self) -> Any:
        """The backend's class, its module imported now."""
        module = import_optional(self.module_name, __name__, provided_by=self.packages, unavailable=self._unavailable)
        return getattr(module, self.class_name)

    def _unavailable(self, missing: str) -> AttentionBackendUnavailableError:
        return AttentionBackendUnavailableError(
            f"the {self.name} attention backend needs {self.needs.format(missing=missing)}: "
            f"pip install 'cudagraph-engine[{self.name}]', or use --attention-backend torch"
        )

    def __call__(self, req_to_token_pool: ReqToTokenPool, kv_pool: TokenToKVPool, shape: Any) -> Any:
        return self.load()(
            req_to_token_pool, kv_pool, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.attention_scale
        )


class AttentionBackendUnavailableError(RuntimeError):
    """An attention backend was asked for whose optional dependency is not installed; the message names the extra."""


class AttentionBackendError(ValueError):
    """An attention backend was asked for by name that cannot serve this model here: the message names the failed
    condition and the alternative."""


ATTENTION_BACKENDS: dict[str, Callable[..., Any]] = {
    "torch": _torch_backend,
    "flashinfer": _OptionalBackend(
        "flashinfer",
        ".flashinfer_backend",
        "FlashInferAttentionBackend",
        ("flashinfer", "tvm_ffi"),
        "the flashinfer-python package ({missing} is not installed)",
    ),
    "triton": _OptionalBackend(
        "triton",
        ".triton_backend",
        "TritonAttentionBackend",
        ("triton",),
        "the triton package (CUDA builds of torch ship it)",
    ),
}
"""Attention backend name -> factory ``(req_to_token_pool, kv_pool, model_shape)``."""

ATTENTION_BACKEND_CHOICES = (AUTO, *ATTENTION_BACKENDS)
"""Every accepted name (the CLI's ``--attention-backend`` choices)."""


def attention_backend_installed(name: str) -> bool:
    """Whether backend ``name``'s optional package imports here (its module is imported to find out)."""
    factory = ATTENTION_BACKENDS[name]
    if not isinstance(factory, _OptionalBackend):
        return True
    try:
        factory.load()
    except AttentionBackendUnavailableError:
        return False
    return True


def attention_backend_class(name: str, target: AttentionTarget) -> type:
    """The class of the attention backend ``name`` builds for ``target`` (``auto``: the one ``auto`` takes, chosen
    without logging), imported but not built: its capabilities (``captures_extend_attention``, ``supports_verify``)
    can be read before any model exists. A backend asked for by name that cannot run here raises
    ``AttentionBackendUnavailableError`` (its package is missing) or ``AttentionBackendError`` (a condition fails),
    as building it would, without reading a weight."""
    if name == AUTO:
        name, _ = auto_choice(target, attention_backend_installed)
    factory = ATTENTION_BACKENDS.get(name)
    if factory is None:
        raise AttentionBackendError(
            f"unknown attention backend {name!r}; choose one of {', '.join(ATTENTION_BACKEND_CHOICES)}"
        )
    backend_class = factory.load() if isinstance(factory, _OptionalBackend) else TorchAttentionBackend
    problem = named_backend_problem(name, target, os.environ)
    if problem is not None:
        raise AttentionBackendError(problem)
    return backend_class  # type: ignore[no-any-return]


def make_attention_backend(name: str, req_to_token_pool: ReqToTokenPool, kv_pool: TokenToKVPool, shape: Any) -> Any:
    """The attention backend called ``name`` for this cache and model shape; ``auto``: the first of ``AUTO_ORDER``
    that can run here (``choice.choose_attention_backend``, which logs why)."""
    if name == AUTO:
        target = AttentionTarget(req_to_token_pool.req_to_token.device, kv_pool.dtype, shape.head_dim)
        name = choose_attention_backend(target, attention_backend_installed)
    factory = ATTENTION_BACKENDS.get(name)
    if factory is None:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {list(ATTENTION_BACKEND_CHOICES)}")
    return factory(req_to_token_pool, kv_pool, shape)


__all__ = [
    "ATTENTION_BACKENDS",
    "ATTENTION_BACKEND_CHOICES",
    "AUTO_ORDER",
    "AttentionBackendError",
    "AttentionBackendUnavailableError",
    "AttentionTarget",
    "DecodeMetadata",
    "ExtendMetadata",
    "TorchAttentionBackend",
    "attend",
    "attention_backend_class",
    "attention_backend_installed",
    "choose_attention_backend",
    "make_attention_backend",
    "unified_attention",
]
