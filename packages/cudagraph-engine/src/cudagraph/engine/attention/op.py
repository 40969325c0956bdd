"""The engine's one attention operator, ``torch.ops.cudagraph_engine.unified_attention(q, k, v, output, layer_id)``.

It writes the layer's new keys and values into the KV cache (unless ``kv_stored=True`` says the caller already did)
and the attention result into ``output`` (a buffer the caller allocates), reading the batch and the attention
backend from the forward context. Because it returns nothing
and mutates only its arguments, a full graph captures it like any other op, and the breakable backend can register
it as a break point and run it again at replay with the same tensors.
"""

from __future__ import annotations

import torch

from cudagraph.backend_utils import get_forward_context, register_break_op

_LIBRARY = torch.library.Library("cudagraph_engine", "DEF")
_LIBRARY.define(
    "unified_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) output, int layer_id, *, bool kv_stored=False) -> ()"
)


def _unified_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, output: torch.Tensor, layer_id: int, *, kv_stored: bool = False
) -> None:
    context = get_forward_context()
    context.attn_backend.forward(q, k, v, output, layer_id, context.forward_batch, kv_stored=kv_stored)


def _unified_attention_meta(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, output: torch.Tensor, layer_id: int, *, kv_stored: bool = False
) -> None:
    return None


# One implementation for every device: the backend in the forward context picks the kernels.
_LIBRARY.impl("unified_attention", _unified_attention, "CompositeExplicitAutograd")
_LIBRARY.impl("unified_attention", _unified_attention_meta, "Meta")

unified_attention = torch.ops.cudagraph_engine.unified_attention
"""The registered operator (an ``OpOverloadPacket``)."""

register_break_op(unified_attention)


def attend(layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The ``attend`` callback the model calls: ``[T, Hq*D]`` attention output for layer ``layer_id``.

    The keys and values are stored before the op (plain tensor ops, so graphs capture them even where the op is an
    eager break), and the op only attends: a breakable replay then runs as little as possible eagerly.
    """
    context = get_forward_context()
    context.attn_backend.store_kv(k, v, layer_id, context.forward_batch.out_cache_loc)
    output = torch.empty_like(q)
    unified_attention(q, k, v, output, layer_id, kv_stored=True)
    return output
