"""The decoder layer's fusable operations as one swappable set, and its plain-torch implementation (the reference).

A kernel set is everything a layer computes besides attention: RMSNorm (alone and fused with the residual add),
Qwen3's per-head q/k norm with rotary in place, the projections, and the down projection of ``silu(gate) * up``.
``TorchKernels`` keeps the reference numerics in plain torch and runs anywhere, including under ``torch.compile``;
``flashinfer.layer_set`` runs the norms, rotary and activation as FlashInfer's fused CUDA kernels (the projections stay
cuBLAS matmuls, the compound operations compositions: ``ComposedKernels``), and ``triton.layer_set`` fuses further
(head norms with rotary in one kernel, the activation into the down projection, decode projections without split-K).
``registry`` chooses between them.

Every operation is capturable in a CUDA graph: no host syncs, no shape that depends on tensor values. The q/k head
norm and rotary write their result back into the fused q/k/v projection wherever they can (always, but for torch
kernels under ``torch.compile``: see ``out_views``), so keys and values stay side by side and the KV store is one
kernel.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeAlias

import torch
import torch.nn.functional as F
from torch import Tensor

from .out_views import compute_into
from .rotary import apply_rotary, rotary_cos_sin_table

if TYPE_CHECKING:
    from ..model.architecture import ModelConfig


class RotaryStep(NamedTuple):
    """What ``rotate`` reads in one forward, built once for every layer by ``rotary_step``: the kernel set's
    rotary table (or its rows gathered at ``positions``, where the set gathers up front) and the positions."""

    cos_sin: Tensor
    positions: Tensor


KVDestination: TypeAlias = tuple[Tensor, Tensor]
"""``(kv_buffer, slots)``: a layer's cache ``[slots, 2, Hk, D]`` and the rows this step's keys and values go to."""


LoraDelta: TypeAlias = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Sequence[tuple[int, int]]], None]
"""``lora_delta(out, x, a, b, scales, rows)``: every target's batched LoRA delta of ``x`` ``[T, K]`` added to its
rows of ``out`` in place (``a`` ``[targets, slots, rank, K]``, ``b`` ``[rows spanned, targets, slots, rank]`` with
target ``j``'s B in column block ``j``, ``scales`` ``[T, slots * rank]``, ``rows`` the targets' ``(start, stop)``);
``triton.lora.lora_delta`` is the one implementation, the adapters' own torch path the reference."""


class QKHeads(NamedTuple):
    """Where a layer's q and k heads sit in its fused q/k/v projection ``[T, H, D]`` (q heads first, then k, then
    v), and Qwen3's per-head norm of them: ``norm_weight`` ``[Hq + Hk, D]`` holds one row per normed head (the q
    norm's vector repeated for q heads, the k norm's for k heads), or is None where the model norms no heads."""

    num_q_heads: int
    num_k_heads: int
    norm_weight: Tensor | None = None
    eps: float = 0.0


class LayerKernels(Protocol):
    """The operations of a decoder layer besides attention. Tensors are ``[T, ...]`` in the model dtype.
    ``add_rms_norm`` and ``norm_and_rotate`` may write into the tensors they are given, so callers pass tensors they own
    (intermediates of the forward, never parameters or caller inputs) and go on with the returned ones."""

    name: str
    """The registry name (``registry.KERNEL_BACKENDS``)."""

    fuses_kv_store: bool
    """Whether ``norm_rotate_and_store`` writes the keys and values in the same kernel as rotary (a layer then
    stores them there, and its attention skips its own store; or, where ``attend`` offers
    ``rotate_store_and_attend``, as in a traced forward, hands it the unrotated heads to do the same); else a layer
    leaves the store to attention."""

    lora_delta: LoraDelta | None
    """The set's fused LoRA delta (``LoraDelta``), or None where LoRA adapters add their deltas in plain torch."""

    def rms_norm(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        """RMSNorm of ``x`` ``[T, hidden]`` over its last dimension, scaled by ``weight`` ``[hidden]``."""
        ...

    def add_rms_norm(self, x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        """``(rms_norm(x + residual), x + residual)``: the residual stream grows by ``x``, then is normed."""
        ...

    def norm_and_rotate(self, heads: Tensor, q_and_k: QKHeads, rotary: RotaryStep) -> Tensor:
        """The q and k heads ``[T, Hq + Hk, D]`` of ``heads`` ``[T, H, D]`` (the v heads left alone), normed per head
        where ``q_and_k`` has a norm weight, then rotated by their positions; written into ``heads`` where the set
        can. A set that writes a new tensor may return ``[T, Hq + 2 Hk, D]``, the v heads copied after the k heads
        (so that keys and values sit side by side for the store); the layer then takes v from there."""
        ...

    def norm_rotate_and_store(
        self, heads: Tensor, q_and_k: QKHeads, rotary: RotaryStep, kv_destination: KVDestination
    ) -> Tensor:
        """``norm_and_rotate``, and each token's rotated keys and its values (the ``Hk`` heads after the k heads)
        written to row ``slots[t]`` of ``kv_buffer`` ``[slots, 2, Hk, D]`` for ``kv_destination = (kv_buffer,
        slots)`` (keys, then values: a ``TokenToKVPool`` layer)."""
        ...

    def rotary_table(self, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> Tensor:
        """The table ``rotary_step`` reads, built once per model, for every position below
        ``max_position_embeddings`` (its layout is the kernel set's own)."""
        ...

    def rotary_step(self, table: Tensor, positions: Tensor) -> RotaryStep:
        """This forward's rotary input for the tokens at ``positions`` ``[T]`` (int64)."""
        ...

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """A projection: ``x @ weight.T (+ bias)`` for ``x`` ``[T, K]`` and ``weight`` ``[N, K]``; ``[T, N]``."""
        ...

    def silu_mul_linear(self, gate_up: Tensor, weight: Tensor) -> Tensor:
        """The down projection of ``silu(gate) * up``: ``gate_up`` ``[T, 2 * I]`` holds gate then up, ``weight`` is
        ``[N, I]``; ``[T, N]``."""
        ...

    def add_norm_linear(
        self, x: Tensor, residual: Tensor, norm_weight: Tensor, eps: float, weight: Tensor, bias: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``(linear(rms_norm(x + residual), weight, bias), x + residual)``: ``add_rms_norm`` and the projection
        after it (q/k/v, gate/up). The returned stream may be ``residual`` grown in place or a new tensor."""
        ...


class ComposedKernels(ABC):
    """The compound operations of ``LayerKernels`` composed from a set's single ones: head norm then rotary, and the
    activation then the down projection, with the projections as cuBLAS matmuls (``F.linear``); the KV store, where
    asked for, is one more kernel after rotary, so layers leave it to attention (``fuses_kv_store`` is False); LoRA
    adapters add their deltas through their own torch path (``lora_delta`` is None)."""

    fuses_kv_store = False
    lora_delta: LoraDelta | None = None

    @abstractmethod
    def add_rms_norm(self, x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        """``LayerKernels.add_rms_norm``: the set's fused residual add + RMSNorm."""

    @abstractmethod
    def qk_rms_norm(self, heads: Tensor, weight: Tensor, num_q_heads: int, eps: float) -> Tensor:
        """Qwen3's head norms of the q then k heads at the front of ``heads`` ``[T, H, D]``, by ``weight``
        ``[Hq + Hk, D]`` (``LayerKernels.norm_and_rotate``); the normed heads ``[T, Hq + Hk, D]``, written into
        ``heads`` where the set can."""

    @abstractmethod
    def rotate(self, qk_heads: Tensor, num_q_heads: int, rotary: RotaryStep) -> Tensor:
        """The q and k heads ``qk_heads`` ``[T, Hq + Hk, D]`` (q first) rotated by their positions, written into
        ``qk_heads`` where the set can."""

    @abstractmethod
    def silu_and_mul(self, gate_up: Tensor) -> Tensor:
        """``silu(gate) * up`` for ``gate_up`` ``[T, 2 * I]`` holding gate then up; ``[T, I]``."""

    def norm_and_rotate(self, heads: Tensor, q_and_k: QKHeads, rotary: RotaryStep) -> Tensor:
        """``qk_rms_norm`` (when there is a weight), then ``rotate``."""
        num_q_heads, num_k_heads, norm_weight, eps = q_and_k
        if norm_weight is None:
            qk = heads[:, : num_q_heads + num_k_heads]
        else:
            qk = self.qk_rms_norm(heads, norm_weight, num_q_heads, eps)
        return self.rotate(qk, num_q_heads, rotary)

    def norm_rotate_and_store(
        self, heads: Tensor, q_and_k: QKHeads, rotary: RotaryStep, kv_destination: KVDestination
    ) -> Tensor:
        """``norm_and_rotate``, then one ``index_put_`` of the k and v heads into the destination."""
        qk = self.norm_and_rotate(heads, q_and_k, rotary)
        kv_buffer, slots = kv_destination
        num_q_heads, num_k_heads = q_and_k.num_q_heads, q_and_k.num_k_heads
        kv_heads = heads[:, num_q_heads : num_q_heads + 2 * num_k_heads].unflatten(1, (2, num_k_heads))
        kv_buffer.index_put_((slots,), kv_heads)
        return qk

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """``F.linear``."""
        return F.linear(x, weight, bias)

    def silu_mul_linear(self, gate_up: Tensor, weight: Tensor) -> Tensor:
        """``silu_and_mul``, then ``F.linear``."""
        return F.linear(self.silu_and_mul(gate_up), weight)

    def add_norm_linear(
        self, x: Tensor, residual: Tensor, norm_weight: Tensor, eps: float, weight: Tensor, bias: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``add_rms_norm`` (the set's own), then ``linear``."""
        normed, residual = self.add_rms_norm(x, residual, norm_weight, eps)
        return self.linear(normed, weight, bias), residual


class TorchKernels(ComposedKernels):
    """The reference kernel set in plain torch: runs on every device and dtype, and dynamo traces it.

    Numerics follow the Hugging Face implementation: the residual add rounds to the model dtype before the norm,
    norms reduce in float32, the head norm rounds before its scale, and ``silu(gate) * up`` rounds the activation
    first. Two fusions round once where the reference rounds twice (at most one ulp apart): the hidden-size norms
    apply their weight inside torch's fused RMSNorm kernel, and rotary adds its second product with ``addcmul``.
    """

    name = "torch"

    def rms_norm(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        """Normalize and scale in float32, round once to ``x``'s dtype."""
        return F.rms_norm(x, weight.shape, weight, eps)

    def add_rms_norm(self, x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        """Add ``x`` into ``residual`` in place (rounded, as the reference adds), then norm the sum."""
        residual.add_(x)
        return F.rms_norm(residual, weight.shape, weight, eps), residual

    def qk_rms_norm(self, heads: Tensor, weight: Tensor, num_q_heads: int, eps: float) -> Tensor:
        """Norm every head of the contiguous projection (v's too, then dropped: cheaper than copying out the q/k
        slice), round, then scale the q and k heads by their rows of ``weight``, into ``heads`` when eager."""
        num_normed = weight.shape[0]
        normed = F.rms_norm(heads, heads.shape[-1:], eps=eps)
        return compute_into(heads[:, :num_normed], torch.mul, normed[:, :num_normed], weight)

    def rotary_table(self, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> Tensor:
        """``rotary.rotary_cos_sin_table``: ``cos`` then signed ``sin`` per position, in the model dtype."""
        return rotary_cos_sin_table(config, dtype, device)

    def rotary_step(self, table: Tensor, positions: Tensor) -> RotaryStep:
        """The table's rows at ``positions``, gathered once per forward rather than once per layer."""
        return RotaryStep(torch.index_select(table, 0, positions), positions)

    def rotate(self, qk_heads: Tensor, num_q_heads: int, rotary: RotaryStep) -> Tensor:
        """q and k heads together in three kernels (``rotary.apply_rotary``), into ``qk_heads`` when eager."""
        return apply_rotary(qk_heads, rotary.cos_sin, out=qk_heads)

    def silu_and_mul(self, gate_up: Tensor) -> Tensor:
        """``F.silu(gate) * up``, each rounded, as the reference computes it."""
        intermediate = gate_up.shape[-1] // 2
        return F.silu(gate_up[:, :intermediate]) * gate_up[:, intermediate:]


TORCH_KERNELS = TorchKernels()
"""The kernel set a model uses until ``CausalLM.use_kernels`` picks another."""
