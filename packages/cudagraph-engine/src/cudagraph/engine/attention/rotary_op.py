"""``torch.ops.cudagraph_engine.rotate_store_attention``: a layer's q/k head norms and rotary, the KV store and
attention as one operator, for a traced forward over the Triton kernel set.

Eagerly the Triton set stores the keys and values inside its rotary kernel (``ops.qk_norm_rope`` with the attention
backend's ``kv_destination``). A traced forward cannot ask for that destination (it reads the forward context), so
the layer hands this op the unrotated q/k/v heads and the rotary inputs instead: the op reads the destination inside,
rotates and stores in one launch, then attends. ``layer_id`` appears only here, so the graph pieces between two
attention calls stay the same graph for every layer.

At a ``tc_piecewise`` capture, the op's capture prefix (``rotate_and_store_before_attention``) launches that rotary
kernel inside the graph segment before the split and tells the op (``rotated=True``) that only attention is left;
the replay binder (``bind_rotated_attention``) binds that attention like ``unified_attention``'s binder does. A
replay then launches exactly what an eager step launches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from cudagraph.backend_utils import ForwardContext, get_forward_context, register_split_op

from ..op_library import implement_op

_LIBRARY = torch.library.Library("cudagraph_engine", "FRAGMENT")
_LIBRARY.define(
    "rotate_store_attention(Tensor(a!) heads, Tensor? norm_weight, int num_q_heads, int num_k_heads, float eps, "
    "Tensor cos_sin, Tensor positions, Tensor(b!) output, int layer_id, *, bool rotated=False) -> ()"
)


def attention_heads(
    heads: torch.Tensor, num_q_heads: int, num_k_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, k, v)`` ``[T, H * D]`` views of the q, k and v heads of ``heads`` ``[T, Hq + 2 Hk, D]``."""
    kv_start = num_q_heads + num_k_heads
    return (
        heads[:, :num_q_heads].flatten(1),
        heads[:, num_q_heads:kv_start].flatten(1),
        heads[:, kv_start : kv_start + num_k_heads].flatten(1),
    )


@dataclass(frozen=True)
class RotaryAttentionCall:
    """The arguments of one ``rotate_store_attention`` call, in the schema's order: the op, its capture prefix and
    its replay binder all receive them."""

    heads: torch.Tensor
    """``[T, Hq + 2 Hk, D]``: the q, k and v heads, rotated in place."""
    norm_weight: torch.Tensor | None
    num_q_heads: int
    num_k_heads: int
    eps: float
    cos_sin: torch.Tensor
    positions: torch.Tensor
    output: torch.Tensor
    layer_id: int
    rotated: bool = field(default=False, kw_only=True)
    """Whether the heads are already rotated and stored (by the capture prefix): only attention is left."""

    def qkv(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The q, k and v views of ``heads``."""
        return attention_heads(self.heads, self.num_q_heads, self.num_k_heads)

    def rotate_and_store(self, context: ForwardContext) -> None:
        """Norm and rotate the q and k heads in place and store the keys and values: one launch where the attention
        backend names the destination (``kv_destination``), else rotary then the backend's ``store_kv``."""
        from ..kernels.triton import ops  # Triton is optional: imported only where its kernel set runs

        backend = context.attn_backend
        slots = context.forward_batch.out_cache_loc
        destination = getattr(backend, "kv_destination", None)
        kv_store = None if destination is None else destination(self.layer_id, slots)
        ops.qk_norm_rope(
            self.heads, self.norm_weight, self.num_q_heads, self.num_k_heads, self.eps, self.cos_sin, self.positions,
            kv_store,
        )  # fmt: skip
        if kv_store is None:
            _, k, v = self.qkv()
            backend.store_kv(k, v, self.layer_id, slots)


def _rotate_store_attention(*args: Any, **kwargs: Any) -> None:
    call = RotaryAttentionCall(*args, **kwargs)
    context = get_forward_context()
    if not call.rotated:
        call.rotate_and_store(context)
    q, k, v = call.qkv()
    context.attn_backend.forward(q, k, v, call.output, call.layer_id, context.forward_batch, kv_stored=True)


def _rotate_store_attention_meta(*args: object, **kwargs: object) -> None:
    return None


rotate_store_attention = implement_op(
    _LIBRARY, "rotate_store_attention", _rotate_store_attention, _rotate_store_attention_meta
)
"""The registered rotary + KV store + attention operator (an ``OpOverloadPacket``)."""

# The op writes the cache, which its schema cannot name (the cache is not an argument): keep dead-code elimination
# from dropping a call where nothing reads what it writes in place.
torch.fx.node.has_side_effect(rotate_store_attention.default)


def rotate_and_store_before_attention(*args: Any, **kwargs: Any) -> Mapping[str, Any] | None:
    """The capture prefix of ``rotate_store_attention`` (the op's arguments, ``RotaryAttentionCall``): at a
    ``tc_piecewise`` capture, norm, rotate and store in the graph segment before the split (in place in ``heads``)
    and tell the op (``rotated=True``) that only attention is left. Nothing to do when the heads are already
    rotated."""
    call = RotaryAttentionCall(*args, **kwargs)
    if call.rotated:
        return None
    call.rotate_and_store(get_forward_context())
    return {"rotated": True}


def bind_rotated_attention(*args: Any, **kwargs: Any) -> Callable[[], object] | None:
    """The replay binder of ``rotate_store_attention`` (the op's arguments, ``RotaryAttentionCall``): once the heads
    are rotated and stored (``rotated``), the attention backend's pre-bound attention over their q view; ``None``
    (replay calls the op) otherwise, or where the backend binds nothing for this batch."""
    call = RotaryAttentionCall(*args, **kwargs)
    if not call.rotated:
        return None
    context = get_forward_context()
    q, k, v = call.qkv()
    return context.attn_backend.bind_forward(q, k, v, call.output, call.layer_id, context.forward_batch, kv_stored=True)  # type: ignore[no-any-return]


register_split_op(
    rotate_store_attention, replay_binder=bind_rotated_attention, capture_prefix=rotate_and_store_before_attention
)
