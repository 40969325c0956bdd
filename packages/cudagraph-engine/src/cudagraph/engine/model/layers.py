"""The decoder's building blocks in a fused layout: one q/k/v matmul, one gate/up matmul, q and k normed and rotated
in place in the projection, and the residual add fused into the next norm (a batch-1 decode step is bound by
kernel count, not FLOPs).

Everything besides attention goes through the module's kernel set (``cudagraph.engine.kernels.LayerKernels``): plain
torch by default, FlashInfer's or Triton's fused kernels where ``CausalLM.use_kernels`` picks them. A layer hands the
residual stream on unnormed, SGLang-style: ``hidden, residual = norm(hidden, residual)`` adds the previous block's
output to the stream and norms it in one step, so an output or down projection ends a block (a tensor-parallel
all-reduce of its result goes right there). Nothing here syncs with the host or makes a shape depend on data: a forward
is capturable in a CUDA graph.
"""

from __future__ import annotations

from typing import Protocol, cast

import torch
from torch import nn

from ..kernels.layer_set import TORCH_KERNELS, LayerKernels, QKHeads, RotaryStep
from .architecture import ModelConfig
from .collectives import all_reduced
from .moe import SparseMoE
from .moe_a2a import ExpertExchange
from .parallel import RowRange


class AttendFn(Protocol):
    """Attention supplied by the caller: ``attend(layer_id, q, k, v) -> out``.

    ``q`` is ``[T, num_heads * head_dim]``, ``k`` and ``v`` ``[T, num_kv_heads * head_dim]``, with rotary (and
    Qwen3's q/k norms) already applied; the result is ``[T, num_heads * head_dim]`` in the activation dtype.
    They are column slices of fused tensors, normally ``v`` right after ``k`` in every row of one (a KV store can
    then write both as one ``[T, 2, num_kv_heads, head_dim]`` view): the last dimension is contiguous but, for
    ``T > 1``, the row stride is larger than the width, so an implementation must not assume they are contiguous
    (``reshape`` or ``copy_`` them, never ``view`` across rows). Scale scores by ``config.attention_scale``.
    """

    def __call__(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attend ``q`` to ``k``/``v`` for layer ``layer_id``."""
        ...


class KVStoringAttendFn(AttendFn, Protocol):
    """An ``attend`` that can say where a layer's keys and values go, so a kernel set that fuses the KV store into
    rotary (``LayerKernels.fuses_kv_store``) writes them there and tells ``attend`` they are stored."""

    def __call__(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, kv_stored: bool = False
    ) -> torch.Tensor:
        """Attend ``q`` for layer ``layer_id``; ``kv_stored=True``: ``k`` and ``v`` are already in the cache."""
        ...

    def kv_destination(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(kv_buffer [slots, 2, Hkv, D], slots [T])`` for this step's keys and values, or None (store them by
        calling ``attend`` as usual)."""
        ...

    def rotate_store_and_attend(
        self, layer_id: int, heads: torch.Tensor, q_and_k: QKHeads, rotary: RotaryStep
    ) -> torch.Tensor | None:
        """Optional. Where ``kv_destination`` is None: attention ``[T, Hq * D]`` from the unrotated q/k/v heads
        ``heads`` ``[T, Hq + 2 Hk, D]`` (rotated in place), with the head norms, rotary and KV store done in the
        kernel set's one rotary launch by ``attend`` itself; or None (the layer rotates, then calls ``attend``)."""
        ...


class ProjectionAdapters(Protocol):
    """Low-rank deltas an engine adds to a layer's projections (LoRA: ``cudagraph.engine.lora``), set on
    ``Attention.adapters``. While ``active`` (a host switch, fixed for a captured graph) the layer adds them in place to
    its q/k/v projection and to its output projection, and computes the norm before q/k/v apart from the projection
    (the adapters read the normed input, which a fused norm + projection never materializes)."""

    @property
    def active(self) -> bool:
        """Whether the forward now running applies the deltas."""
        ...

    def add_to_qkv(self, x: torch.Tensor, qkv: torch.Tensor, kernels: LayerKernels) -> None:
        """Add the q/k/v deltas of the normed input ``x`` ``[T, hidden]`` to ``qkv`` in place; ``kernels`` is the
        layer's kernel set (its ``lora_delta``, where it has one, computes them)."""
        ...

    def add_to_o(self, x: torch.Tensor, out: torch.Tensor, kernels: LayerKernels) -> None:
        """Add the output projection's delta of the attention output ``x`` to ``out`` ``[T, hidden]`` in place
        (``kernels`` as for ``add_to_qkv``)."""
        ...


def _parameter(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class KernelModule(nn.Module):
    """A module that computes through a kernel set: ``kernels``, plain torch until ``CausalLM.use_kernels`` sets
    another on every ``KernelModule`` of the model."""

    kernels: LayerKernels = TORCH_KERNELS


class RMSNorm(KernelModule):
    """Root-mean-square norm over the last dimension, then a learned per-channel scale; ``add_and_norm`` first
    adds a block's output to the residual stream, in the same kernel where the kernel set fuses them."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _parameter((size,), dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The norm of ``x`` ``[T, size]``, a new tensor."""
        return self.kernels.rms_norm(x, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(x + residual), x + residual)``; both may reuse the storage of ``x`` and ``residual``."""
        return self.kernels.add_rms_norm(x, residual, self.weight, self.eps)

    def add_norm_and_project(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(linear(norm(x + residual), weight, bias), x + residual)``: the add and norm in the projection's kernel
        where the kernel set fuses them; the stream may reuse ``residual``'s storage or be a new tensor."""
        return self.kernels.add_norm_linear(x, residual, self.weight, self.eps, weight, bias)


class HeadRMSNorm(nn.Module):
    """Qwen3's per-head RMSNorm of q (by ``q_norm``'s weight) and k (by ``k_norm``'s): ``weight`` holds one row per
    head, the first ``num_q_heads`` rows a copy of q's vector and the rest a copy of k's, so the torch kernels scale
    with one broadcast product and the fused ones read one row of each."""

    def __init__(
        self, num_q_heads: int, num_k_heads: int, head_dim: int, eps: float, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _parameter((num_q_heads + num_k_heads, head_dim), dtype, device)


class Attention(KernelModule):
    """Grouped-query self-attention around a caller-supplied ``attend``: fused q/k/v projection (with Qwen2's
    bias), Qwen3's per-head q/k norms and rotary (both in place in the projection), and the output projection
    (row-parallel: all-reduced over ``reduce_group`` when the model is sharded). ``adapters``, when an engine sets
    them, add low-rank deltas to both projections while active."""

    adapters: ProjectionAdapters | None = None

    def __init__(
        self, config: ModelConfig, layer_id: int, dtype: torch.dtype, device: torch.device, reduce_group: str | None
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.reduce_group = reduce_group
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.q_size
        self.kv_size = config.kv_size
        qkv_size = config.q_size + 2 * config.kv_size
        self.qkv_weight = _parameter((qkv_size, config.hidden_size), dtype, device)
        self.qkv_bias = _parameter((qkv_size,), dtype, device) if config.qkv_bias else None
        self.o_weight = _parameter((config.hidden_size, config.q_size), dtype, device)
        self.o_bias = _parameter((config.hidden_size,), dtype, device) if config.o_bias else None
        self.qk_norm = (
            HeadRMSNorm(config.num_heads, config.num_kv_heads, config.head_dim, config.rms_norm_eps, dtype, device)
            if config.qk_norm
            else None
        )

    def forward(self, x: torch.Tensor, rotary: RotaryStep, attend: AttendFn) -> torch.Tensor:
        """``attention(x)`` projected back to ``[T, hidden]``, for the normed ``x`` ``[T, hidden]`` (the caller adds
        it to the residual stream)."""
        qkv = self.kernels.linear(x, self.qkv_weight, self.qkv_bias)
        adapters = self.adapters
        if adapters is not None and adapters.active:
            adapters.add_to_qkv(x, qkv, self.kernels)
        return self.attend_projected(qkv, rotary, attend)

    def attend_projected(self, qkv: torch.Tensor, rotary: RotaryStep, attend: AttendFn) -> torch.Tensor:
        """``forward`` from the q/k/v projection ``qkv`` ``[T, q_size + 2 * kv_size]`` on (a layer that computes it
        together with the norm before it passes it here); ``qkv`` is written in place."""
        heads = qkv.unflatten(-1, (-1, self.head_dim))  # q heads, then k heads, then v heads: a view of qkv
        head_norm = self.qk_norm
        if head_norm is None:
            q_and_k = QKHeads(self.num_heads, self.num_kv_heads)
        else:
            q_and_k = QKHeads(self.num_heads, self.num_kv_heads, head_norm.weight, head_norm.eps)
        destination = self._kv_destination(attend)
        if destination is None:
            out = self._rotate_store_and_attend(attend, heads, q_and_k, rotary)
            if out is not None:
                return self._project(out)
            # Normed and rotated in qkv itself where the kernels can, so that v still follows k in every row.
            qk = self.kernels.norm_and_rotate(heads, q_and_k, rotary)
        else:
            qk = self.kernels.norm_rotate_and_store(heads, q_and_k, rotary, destination)
        qk = qk.flatten(1)
        q, k = qk[:, : self.q_size], qk[:, self.q_size : self.q_size + self.kv_size]
        # A kernel set may return the v heads after the rotated ones (side by side with k for the store): take them.
        v = (qk if qk.shape[1] == self.q_size + 2 * self.kv_size else qkv)[:, self.q_size + self.kv_size :]
        if destination is None:
            out = attend(self.layer_id, q, k, v)
        else:
            out = cast(KVStoringAttendFn, attend)(self.layer_id, q, k, v, kv_stored=True)
        return self._project(out)

    def _project(self, out: torch.Tensor) -> torch.Tensor:
        """The output projection of the attention output ``out`` ``[T, q_size]``: ``[T, hidden]``."""
        if self.reduce_group is None:
            projected = self.kernels.linear(out, self.o_weight, self.o_bias)
            adapters = self.adapters
            if adapters is not None and adapters.active:
                adapters.add_to_o(out, projected, self.kernels)
            return projected
        # Row-parallel: every rank's partial product is summed before the bias, which only one sum may carry.
        projected = all_reduced(self.kernels.linear(out, self.o_weight), self.reduce_group)
        return projected if self.o_bias is None else projected.add_(self.o_bias)

    def _rotate_store_and_attend(
        self, attend: AttendFn, heads: torch.Tensor, q_and_k: QKHeads, rotary: RotaryStep
    ) -> torch.Tensor | None:
        """Attention from the unrotated ``heads``, by ``attend``'s one op that rotates, stores and attends, where the
        kernels store in their rotary and ``attend`` takes the heads so (a traced forward); else None."""
        if not self.kernels.fuses_kv_store:
            return None
        fused = getattr(attend, "rotate_store_and_attend", None)
        return None if fused is None else fused(self.layer_id, heads, q_and_k, rotary)  # type: ignore[no-any-return]

    def _kv_destination(self, attend: AttendFn) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Where this layer's keys and values go, when the kernels store them fused and ``attend`` can say."""
        if not self.kernels.fuses_kv_store:
            return None
        find = getattr(attend, "kv_destination", None)
        return None if find is None else find(self.layer_id)  # type: ignore[no-any-return]


class GatedMLP(KernelModule):
    """SwiGLU feed-forward: one fused gate/up matmul, ``silu(gate) * up``, then the down projection (row-parallel:
    all-reduced over ``reduce_group`` when the model is sharded)."""

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, reduce_group: str | None = None
    ) -> None:
        super().__init__()
        self.reduce_group = reduce_group
        self.gate_up_weight = _parameter((2 * config.intermediate_size, config.hidden_size), dtype, device)
        self.down_weight = _parameter((config.hidden_size, config.intermediate_size), dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``mlp(x)`` over the normed ``x`` ``[T, hidden]`` (the caller adds it to the residual stream)."""
        return self.down(self.kernels.linear(x, self.gate_up_weight))

    def down(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``forward`` from the gate/up projection ``gate_up`` ``[T, 2 * intermediate]`` on."""
        down = self.kernels.silu_mul_linear(gate_up, self.down_weight)
        return down if self.reduce_group is None else all_reduced(down, self.reduce_group)


class DecoderLayer(nn.Module):
    """Pre-norm residual block: ``residual += attn(norm(residual))``, then ``mlp(norm(residual))`` handed on, its
    add deferred to the next norm (the next layer's, or the model's final one). ``mlp`` is a ``GatedMLP``, or a
    ``SparseMoE`` on the layers where ``config.uses_experts(layer_id)``.

    ``config`` holds one rank's heads and MLP width (``ShardPlan.local_config``); ``reduce_group`` names the
    process group whose all-reduce completes the row-parallel projections (``None``: one rank, no collective);
    ``experts``: the experts this rank holds (``ShardPlan.experts``; ``None``: all); ``exchange``: how a sparse
    block's tokens reach the other ranks' experts (``None``: the all-reduce of partial sums)."""

    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        dtype: torch.dtype,
        device: torch.device,
        reduce_group: str | None = None,
        experts: RowRange | None = None,
        exchange: ExpertExchange | None = None,
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.self_attn = Attention(config, layer_id, dtype, device, reduce_group)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.mlp: GatedMLP | SparseMoE = (
            SparseMoE(config, dtype, device, reduce_group, experts, exchange)
            if config.uses_experts(layer_id)
            else GatedMLP(config, dtype, device, reduce_group)
        )

    def forward(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, rotary: RotaryStep, attend: AttendFn
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One block: ``hidden`` is the previous block's output ``[T, hidden]`` not yet added to ``residual`` (the
        first layer gets the embeddings and ``None``); returns this block's ``(mlp output, residual)``. Both
        tensors must be the caller's own: the stream may be updated in place. Each add + norm goes to the kernel set
        together with the projection after it (``add_norm_linear``), which fuses them where it can."""
        attn = self.self_attn
        adapters = attn.adapters
        if residual is None:
            hidden, residual = attn(self.input_layernorm(hidden), rotary, attend), hidden
        elif adapters is not None and adapters.active:  # the adapters read the normed input: norm, then project
            normed, residual = self.input_layernorm.add_and_norm(hidden, residual)
            hidden = attn(normed, rotary, attend)
        else:
            qkv, residual = self.input_layernorm.add_norm_and_project(hidden, residual, attn.qkv_weight, attn.qkv_bias)
            hidden = attn.attend_projected(qkv, rotary, attend)
        if isinstance(self.mlp, SparseMoE):
            normed, residual = self.post_attention_layernorm.add_and_norm(hidden, residual)
            return self.mlp(normed), residual
        gate_up, residual = self.post_attention_layernorm.add_norm_and_project(
            hidden, residual, self.mlp.gate_up_weight
        )
        return self.mlp.down(gate_up), residual
