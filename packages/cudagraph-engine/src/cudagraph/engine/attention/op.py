"""The engine's attention operators, ``torch.ops.cudagraph_engine.unified_attention(q, k, v, output, layer_id)`` and
``torch.ops.cudagraph_engine.store_kv(k, v, layer_id)``, and ``attend``, the callback the model calls with them.

``store_kv`` writes a layer's new keys and values into the KV cache; ``unified_attention`` writes the attention
result into ``output`` (a buffer the caller allocates), storing the keys and values first unless ``kv_stored=True``
says the caller already did. Both read the batch and the attention backend from the forward context *inside* the
op, so the Python that calls them (``attend``, the model) reads no ``ContextVar`` and dynamo traces a whole forward
into one graph; the layer reaches the op as its ``layer_id`` argument, a constant of that graph. Neither returns
anything and both mutate only tensors they are given or the cache, so a full graph captures them like any other op,
the breakable backend breaks at ``unified_attention`` (a registered split op) and runs it again at replay with the
same tensors, and ``tc_piecewise`` splits the compiled graph there.

At a ``tc_piecewise`` capture (where the traced forward leaves the store to ``unified_attention``), the op's capture
prefix (``store_before_unified_attention``) stores the keys and values inside the graph segment before the split, so
only the attention kernel runs eagerly at replay, as at a breakable one. A traced forward over a kernel set whose
rotary stores the keys and values (Triton's) calls ``rotate_store_attention`` (``rotary_op``) instead, through
``attend.rotate_store_and_attend``: rotary and the store are then one launch there too.

At a breakable capture each call is also bound (``bind_unified_attention``, the op's replay binder): the attention
backend returns the exact kernel call for that layer and shape with its views made once, and replay calls it
directly, with no dispatcher, no forward-context lookup and no branching. Eager and compiled forwards always call the
op.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from cudagraph.backend_utils import get_forward_context, register_split_op

from ..kernels.layer_set import QKHeads, RotaryStep
from ..op_library import implement_op
from .rotary_op import rotate_store_attention

_LIBRARY = torch.library.Library("cudagraph_engine", "DEF")
_LIBRARY.define(
    "unified_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) output, int layer_id, *, bool kv_stored=False) -> ()"
)
_LIBRARY.define("store_kv(Tensor k, Tensor v, int layer_id) -> ()")


def _unified_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, output: torch.Tensor, layer_id: int, *, kv_stored: bool = False
) -> None:
    context = get_forward_context()
    context.attn_backend.forward(q, k, v, output, layer_id, context.forward_batch, kv_stored=kv_stored)


def _unified_attention_meta(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, output: torch.Tensor, layer_id: int, *, kv_stored: bool = False
) -> None:
    return None


def _store_kv(k: torch.Tensor, v: torch.Tensor, layer_id: int) -> None:
    context = get_forward_context()
    context.attn_backend.store_kv(k, v, layer_id, context.forward_batch.out_cache_loc)


def _store_kv_meta(k: torch.Tensor, v: torch.Tensor, layer_id: int) -> None:
    return None


# One implementation for every device: the backend in the forward context picks the kernels.
unified_attention = implement_op(_LIBRARY, "unified_attention", _unified_attention, _unified_attention_meta)
"""The registered attention operator (an ``OpOverloadPacket``)."""

store_kv = implement_op(_LIBRARY, "store_kv", _store_kv, _store_kv_meta)
"""The registered KV-store operator (an ``OpOverloadPacket``)."""

# store_kv writes the cache, which its schema cannot name (the cache is not an argument): without this, dead-code
# elimination in a compiled graph would drop a call whose result nobody reads.
torch.fx.node.has_side_effect(store_kv.default)


def bind_unified_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, output: torch.Tensor, layer_id: int, *, kv_stored: bool = False
) -> Callable[[], object] | None:
    """The replay binder of ``unified_attention``: the attention backend's pre-bound call for this layer and these
    tensors (``None``, so replay calls the op, where the backend binds nothing for this batch)."""
    context = get_forward_context()
    return context.attn_backend.bind_forward(q, k, v, output, layer_id, context.forward_batch, kv_stored=kv_stored)


def store_before_unified_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, output: torch.Tensor, layer_id: int, *, kv_stored: bool = False
) -> Mapping[str, Any] | None:
    """The capture prefix of ``unified_attention``: at a ``tc_piecewise`` capture, store this step's keys and values
    inside the graph segment before the split (the store's kernels then replay with the segment) and tell the op it
    need not (``kv_stored=True``), so the eager call at every replay only attends. Nothing to do when the keys and
    values are already stored."""
    if kv_stored:
        return None
    store_kv(k, v, layer_id)
    return {"kv_stored": True}


register_split_op(
    unified_attention, replay_binder=bind_unified_attention, capture_prefix=store_before_unified_attention
)


class EngineAttend:
    """The ``attend`` callback the model calls (``attend``, its one instance): ``[T, Hq*D]`` attention output for a
    layer, and where that layer's keys and values go (``kv_destination``) for kernel sets that store them fused."""

    def __call__(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, kv_stored: bool = False
    ) -> torch.Tensor:
        """Attention of ``q`` over the cache after this step's ``k`` and ``v`` are in it.

        Run eagerly (eager steps, full and breakable captures), the keys and values are stored by their own op
        before attention (plain tensor ops inside it, so graphs capture them even where attention is an eager
        break), or not at all when the caller's kernels stored them (``kv_stored=True``, at ``kv_destination``);
        ``unified_attention`` only attends: a breakable replay then runs as little as possible eagerly.

        Traced by dynamo (``tc_piecewise``, compiled buckets), ``unified_attention`` stores them itself, so
        ``layer_id`` appears only in the attention call: the graph pieces between two attention calls are then the
        same graph for every layer (the weights are inputs), and inductor compiles one and serves the others from
        its FX graph cache instead of compiling every layer again. Only operators are called here, so dynamo traces
        it without a break.
        """
        output = torch.empty_like(q)
        if torch.compiler.is_compiling():
            unified_attention(q, k, v, output, layer_id, kv_stored=False)
        else:
            if not kv_stored:
                store_kv(k, v, layer_id)
            unified_attention(q, k, v, output, layer_id, kv_stored=True)
        return output

    def rotate_store_and_attend(
        self, layer_id: int, heads: torch.Tensor, q_and_k: QKHeads, rotary: RotaryStep
    ) -> torch.Tensor | None:
        """Traced by dynamo: attention for layer ``layer_id`` from its unrotated q/k/v heads ``heads`` ``[T, Hq + 2
        Hk, D]`` (a view of the projection, rotated in place), by one op (``rotate_store_attention``) that norms,
        rotates and stores in the Triton set's one rotary launch, then attends; ``[T, Hq * D]``. Eager: None (the
        layer stores at ``kv_destination`` in its own rotary launch, as the op would).

        Only a kernel set whose rotary stores the keys and values (``LayerKernels.fuses_kv_store``: Triton's) calls
        this: the op launches that set's kernel. ``layer_id`` appears only in the op call, as in ``__call__``."""
        if not torch.compiler.is_compiling():
            return None
        num_q_heads, num_k_heads, norm_weight, eps = q_and_k
        output = heads.new_empty((heads.shape[0], num_q_heads * heads.shape[2]))
        rotate_store_attention(
            heads, norm_weight, num_q_heads, num_k_heads, eps, rotary.cos_sin, rotary.positions, output, layer_id
        )
        return output

    def kv_destination(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(kv_buffer, slots)`` where layer ``layer_id``'s keys and values of this step go (the attention backend's
        ``kv_destination``), or None where they cannot be stored outside the attention op: a traced forward (the op
        stores them: ``rotate_store_and_attend``, or ``unified_attention``) or a backend without one."""
        if torch.compiler.is_compiling():
            return None
        context = get_forward_context()
        destination = getattr(context.attn_backend, "kv_destination", None)
        return None if destination is None else destination(layer_id, context.forward_batch.out_cache_loc)  # type: ignore[no-any-return]


attend = EngineAttend()
"""The engine's ``attend`` (``layers.AttendFn`` with ``kv_destination``)."""
