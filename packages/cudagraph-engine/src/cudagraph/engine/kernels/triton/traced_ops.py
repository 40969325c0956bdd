"""The Triton kernel set's operations, each a plain function (what eager steps call) with a torch custom op
(``torch.ops.cudagraph_triton.*``) that a forward ``torch.compile`` traces calls in its place.

``TritonKernels`` (``layer_set``) holds the functions themselves: ``ops.rms_norm``, ``ops.add_rms_norm`` and, here,
``linear``, ``silu_mul_linear``, ``add_norm_linear`` and ``norm_rotate`` (and ``lora.lora_delta``, which LoRA
adapters call). Each picks its kernels from the shapes it is given (a ``gemv`` for the few rows of a decode step,
cuBLAS for wider ones) and launches them through ``FastLauncher``, so an eager step (eager, ``full`` and
``breakable`` captures alike) pays no dispatcher and checks nothing more than before.

Dynamo never traces into these functions: each is registered with ``torch._dynamo.substitute_in_graph``, so
where a traced forward calls one, dynamo traces its custom op instead: one graph node a call, whose fake
implementation gives the outputs' shapes and dtypes and whose schema says what it writes. The kernels are chosen by
the number of rows inside the op, on the real tensors, so the traced graph does not branch on the token count (one
compilation serves every bucket); the ops take no layer index and read no forward context, so every layer's call is
the same node over other weights (no recompile per layer, and ``tc_piecewise`` compiles one piece that serves every
layer). Inductor compiles what lies between the ops; inside a captured piece an op's dispatch is paid at capture
only.

Why a substitution rather than a check at each call (``bench/bench_traced_ops.py``, on a 2-core CPU host): a plain
Python call costs 0.07 µs, ``torch.compiler.is_compiling()`` 0.23 µs and ``torch.compiler.is_dynamo_compiling()``
0.07 µs; a layer makes five of these calls, so a check would cost a 28-layer model's eager step 10 to 32 µs of host
time, where the substitution costs it nothing. Calling the custom op eagerly would cost about 11 µs a call more
than its body (the dispatcher and a Python kernel): the tens of µs a step that ``FastLauncher`` removed, back again.

Schemas: every op returns new tensors and mutates nothing but ``norm_rotate_store``, which writes the keys and values
to ``kv_buffer`` at ``slots`` (``mutates_args=("kv_buffer",)``), and ``lora_delta`` (``lora.lora_delta``, which
the set calls as it is), which adds the LoRA delta into the projection ``out`` (``mutates_args=("out",)``: the
projection is an intermediate of the forward, so functionalization turns the write into a new tensor that the
graph uses from then on, with no copy back). Eagerly, ``add_rms_norm`` and the wide steps of
``add_norm_linear`` grow the residual stream in place and ``norm_rotate`` rotates the heads in place in the q/k/v
projection; callers use what they return, never their inputs' storage, so the two agree. The ops' outputs are new
because a traced graph gains from it: functionalization adds no copy for an in-place write to a graph input or to
a view, and a new ``[T, Hq + Hk, D]`` of rotated heads flattens without dynamo guarding on one token (a slice of the
projection would not). The traced ``norm_rotate`` (a forward whose ``attend`` stores the keys and values itself)
returns ``[T, Hq + 2 Hk, D]``: its kernel copies the v heads after the rotated k heads, so the store finds keys and
values side by side and writes them with one kernel, not a stack and a write. The engine's own traced forward
reaches neither rotary op: its ``attend`` takes the unrotated heads (``attention.rotary_op``) and launches
``ops.qk_norm_rope`` with the KV store inside the attention op, as an eager step does.
"""

# No ``from __future__ import annotations``: torch.library reads the ops' schemas from their annotations.

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..layer_set import KVDestination, QKHeads, RotaryStep
from . import lora, ops

__all__ = [
    "TRACED_OPS",
    "add_norm_linear",
    "linear",
    "norm_rotate",
    "silu_mul_linear",
]

NAMESPACE = "cudagraph_triton"
"""The custom ops' namespace: ``torch.ops.cudagraph_triton.<name>``."""


# -- eager: what TritonKernels calls (with ``ops.rms_norm`` and ``ops.add_rms_norm``) ------------------------------


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T (+ bias)``: ``ops.gemv`` for the few rows of a decode step, a cuBLAS matmul for wider steps."""
    tile = ops.gemv_tile(x.shape[0])
    if tile is None:
        return F.linear(x, weight, bias)
    return ops.gemv(x, weight, bias, tile=tile)


def silu_mul_linear(gate_up: Tensor, weight: Tensor) -> Tensor:
    """The down projection of ``silu(gate) * up``: computed on the ``gemv``'s load, or for wide steps its own kernel
    then cuBLAS."""
    tile = ops.gemv_tile(gate_up.shape[0])
    if tile is None:
        return F.linear(ops.silu_and_mul(gate_up), weight)
    return ops.gemv(gate_up, weight, silu_mul=True, tile=tile)


def add_norm_linear(
    x: Tensor,
    residual: Tensor,
    norm_weight: Tensor,
    eps: float,
    weight: Tensor,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``(linear(rms_norm(x + residual), weight, bias), x + residual)``: the add and norm on the ``gemv``'s load (the
    stream a new tensor), or for wide steps the fused add + norm kernel (in place) then cuBLAS."""
    tile = ops.gemv_tile(x.shape[0])
    if tile is None:
        normed, residual = ops.add_rms_norm(x, residual, norm_weight, eps)
        return F.linear(normed, weight, bias), residual
    return ops.add_norm_gemv(x, residual, norm_weight, eps, weight, bias, tile=tile)


def norm_rotate(
    heads: Tensor,
    q_and_k: QKHeads,
    rotary: RotaryStep,
    kv_destination: KVDestination | None,
) -> Tensor:
    """Head norms (when ``q_and_k`` has a weight) and rotary of the q then k heads of ``heads`` ``[T, H, D]``, in
    place, one launch (``ops.qk_norm_rope``); with ``kv_destination`` the same launch stores the keys and values.
    The normed and rotated heads ``[T, Hq + Hk, D]``, a view of ``heads`` (traced: a new tensor)."""
    num_q_heads, num_k_heads, norm_weight, eps = q_and_k
    ops.qk_norm_rope(
        heads, norm_weight, num_q_heads, num_k_heads, eps, rotary.cos_sin, rotary.positions, kv_destination
    )
    return heads[:, : num_q_heads + num_k_heads]


# -- the custom ops: what a traced forward calls --------------------------------------------------------------------


@torch.library.custom_op(f"{NAMESPACE}::rms_norm", mutates_args=())
def _rms_norm_op(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return ops.rms_norm(x, weight, eps)


@_rms_norm_op.register_fake
def _(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return torch.empty_like(x)


@torch.library.custom_op(f"{NAMESPACE}::add_rms_norm", mutates_args=())
def _add_rms_norm_op(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return ops.add_rms_norm_into(x, residual, weight, eps)


@_add_rms_norm_op.register_fake
def _(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return (
        torch.empty_like(x, memory_format=torch.contiguous_format),
        torch.empty_like(x, memory_format=torch.contiguous_format),
    )


@torch.library.custom_op(f"{NAMESPACE}::linear", mutates_args=())
def _linear_op(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return linear(x, weight, bias)


@_linear_op.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.custom_op(f"{NAMESPACE}::silu_mul_linear", mutates_args=())
def _silu_mul_linear_op(gate_up: Tensor, weight: Tensor) -> Tensor:
    return silu_mul_linear(gate_up, weight)


@_silu_mul_linear_op.register_fake
def _(gate_up: Tensor, weight: Tensor) -> Tensor:
    return gate_up.new_empty((gate_up.shape[0], weight.shape[0]))


@torch.library.custom_op(f"{NAMESPACE}::add_norm_linear", mutates_args=())
def _add_norm_linear_op(
    x: Tensor,
    residual: Tensor,
    norm_weight: Tensor,
    eps: float,
    weight: Tensor,
    bias: Tensor | None,
) -> tuple[Tensor, Tensor]:
    tile = ops.gemv_tile(x.shape[0])
    if tile is None:
        normed, total = ops.add_rms_norm_into(x, residual, norm_weight, eps)
        return F.linear(normed, weight, bias), total
    return ops.add_norm_gemv(x, residual, norm_weight, eps, weight, bias, tile=tile)


@_add_norm_linear_op.register_fake
def _(
    x: Tensor,
    residual: Tensor,
    norm_weight: Tensor,
    eps: float,
    weight: Tensor,
    bias: Tensor | None,
) -> tuple[Tensor, Tensor]:
    return x.new_empty((x.shape[0], weight.shape[0])), torch.empty_like(x, memory_format=torch.contiguous_format)


def _rotated_heads(heads: Tensor, num_q_heads: int, num_k_heads: int) -> Tensor:
    """A new ``[T, Hq + Hk, D]`` for the rotated q and k heads of ``heads`` ``[T, H, D]``."""
    return heads.new_empty((heads.shape[0], num_q_heads + num_k_heads, heads.shape[2]))


def _rotated_heads_and_v(heads: Tensor, num_q_heads: int, num_k_heads: int) -> Tensor:
    """A new ``[T, Hq + 2 Hk, D]``: the rotated q and k heads of ``heads`` ``[T, H, D]``, then its v heads."""
    return heads.new_empty((heads.shape[0], num_q_heads + 2 * num_k_heads, heads.shape[2]))


@torch.library.custom_op(f"{NAMESPACE}::norm_rotate", mutates_args=())
def _norm_rotate_op(
    heads: Tensor,
    norm_weight: Tensor | None,
    num_q_heads: int,
    num_k_heads: int,
    eps: float,
    cos_sin: Tensor,
    positions: Tensor,
) -> Tensor:
    out = _rotated_heads_and_v(heads, num_q_heads, num_k_heads)
    ops.qk_norm_rope(heads, norm_weight, num_q_heads, num_k_heads, eps, cos_sin, positions, out=out)
    return out


@torch.library.custom_op(f"{NAMESPACE}::norm_rotate_store", mutates_args=("kv_buffer",))
def _norm_rotate_store_op(
    heads: Tensor,
    norm_weight: Tensor | None,
    num_q_heads: int,
    num_k_heads: int,
    eps: float,
    cos_sin: Tensor,
    positions: Tensor,
    kv_buffer: Tensor,
    slots: Tensor,
) -> Tensor:
    out = _rotated_heads(heads, num_q_heads, num_k_heads)
    ops.qk_norm_rope(heads, norm_weight, num_q_heads, num_k_heads, eps, cos_sin, positions, (kv_buffer, slots), out=out)
    return out


def _fake_rotated(heads: Tensor, norm_weight: Tensor | None, num_q_heads: int, num_k_heads: int, *_: object) -> Tensor:
    """The fake of ``norm_rotate_store``: the normed, rotated q and k heads (the KV store writes in place)."""
    return _rotated_heads(heads, num_q_heads, num_k_heads)


def _fake_rotated_and_v(
    heads: Tensor, norm_weight: Tensor | None, num_q_heads: int, num_k_heads: int, *_: object
) -> Tensor:
    """The fake of ``norm_rotate``: the normed, rotated q and k heads, then the v heads."""
    return _rotated_heads_and_v(heads, num_q_heads, num_k_heads)


_norm_rotate_op.register_fake(_fake_rotated_and_v)
_norm_rotate_store_op.register_fake(_fake_rotated)


def _row_pairs(rows: list[int]) -> list[tuple[int, int]]:
    """The targets' ``(start, stop)`` row ranges from the flat list the ``lora_delta`` op's schema carries."""
    return list(zip(rows[::2], rows[1::2], strict=True))


@torch.library.custom_op(f"{NAMESPACE}::lora_delta", mutates_args=("out",))
def _lora_delta_op(out: Tensor, x: Tensor, a: Tensor, b: Tensor, scales: Tensor, rows: list[int]) -> None:
    lora.lora_delta(out, x, a, b, scales, _row_pairs(rows))


@_lora_delta_op.register_fake
def _(out: Tensor, x: Tensor, a: Tensor, b: Tensor, scales: Tensor, rows: list[int]) -> None:
    return None


TRACED_OPS = {
    "rms_norm": (ops.rms_norm, _rms_norm_op),
    "add_rms_norm": (ops.add_rms_norm, _add_rms_norm_op),
    "linear": (linear, _linear_op),
    "silu_mul_linear": (silu_mul_linear, _silu_mul_linear_op),
    "add_norm_linear": (add_norm_linear, _add_norm_linear_op),
    "norm_rotate": (norm_rotate, _norm_rotate_op),
    "norm_rotate_store": (norm_rotate, _norm_rotate_store_op),
    "lora_delta": (lora.lora_delta, _lora_delta_op),
}
"""Name -> (the eager function, the custom op dynamo traces in its place: ``torch.ops.cudagraph_triton.<name>``;
``norm_rotate`` stands for both rotary ops, the storing one where it is given a destination)."""


# -- the substitutions: dynamo traces the op wherever it meets the function ------------------------------------------


@torch._dynamo.substitute_in_graph(ops.rms_norm)
def _traced_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return torch.ops.cudagraph_triton.rms_norm(x, weight, eps)


@torch._dynamo.substitute_in_graph(ops.add_rms_norm)
def _traced_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    normed, total = torch.ops.cudagraph_triton.add_rms_norm(x, residual, weight, eps)
    return normed, total


@torch._dynamo.substitute_in_graph(linear)
def _traced_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    return torch.ops.cudagraph_triton.linear(x, weight, bias)


@torch._dynamo.substitute_in_graph(silu_mul_linear)
def _traced_silu_mul_linear(gate_up: Tensor, weight: Tensor) -> Tensor:
    return torch.ops.cudagraph_triton.silu_mul_linear(gate_up, weight)


@torch._dynamo.substitute_in_graph(add_norm_linear)
def _traced_add_norm_linear(
    x: Tensor,
    residual: Tensor,
    norm_weight: Tensor,
    eps: float,
    weight: Tensor,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    out, total = torch.ops.cudagraph_triton.add_norm_linear(x, residual, norm_weight, eps, weight, bias)
    return out, total


@torch._dynamo.substitute_in_graph(norm_rotate)
def _traced_norm_rotate(
    heads: Tensor,
    q_and_k: QKHeads,
    rotary: RotaryStep,
    kv_destination: KVDestination | None,
) -> Tensor:
    num_q_heads, num_k_heads, norm_weight, eps = q_and_k
    if kv_destination is None:
        return torch.ops.cudagraph_triton.norm_rotate(
            heads, norm_weight, num_q_heads, num_k_heads, eps, rotary.cos_sin, rotary.positions
        )
    kv_buffer, slots = kv_destination
    return torch.ops.cudagraph_triton.norm_rotate_store(
        heads, norm_weight, num_q_heads, num_k_heads, eps, rotary.cos_sin, rotary.positions, kv_buffer, slots
    )


@torch._dynamo.substitute_in_graph(lora.lora_delta)
def _traced_lora_delta(
    out: Tensor,
    x: Tensor,
    a: Tensor,
    b: Tensor,
    scales: Tensor,
    rows: Sequence[tuple[int, int]],
    tile: lora.LoraTile | None = None,
) -> None:
    # ``tile`` only tunes eager calls (the bench's sweep); the op picks the table's tile from its rows, as it must
    # for a graph that serves every token count.
    torch.ops.cudagraph_triton.lora_delta(out, x, a, b, scales, [bound for pair in rows for bound in pair])
