"""Decode attention with FlashInfer's paged decode kernels (extend attention stays in plain torch).

Graphs use one ``BatchDecodeWithPagedKVCacheWrapper(use_cuda_graph=True)`` per captured batch size, whose index
buffers are static; ``plan`` runs on the host before every replay, from the host copy of ``seq_lens`` the runner
passes, so it never waits on the device. The page size is 1: a KV slot is a page.

A breakable capture binds each decode break to the graph wrapper's kernel launch (``flashinfer_kernel``), so a
replayed break skips FlashInfer's Python ``run`` as well as the op's dispatch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import flashinfer
import torch

from cudagraph.backend_utils import is_capture_mode
from cudagraph.runner import ForwardBatch, ForwardMode

from ..kv_cache import ReqToTokenPool, TokenToKVPool
from .flashinfer_kernel import bind_decode_run
from .torch_backend import TorchAttentionBackend, _in_order

WORKSPACE_BYTES = 128 * 2**20
INT_WORKSPACE_BYTES = 8 * 2**20


@dataclass(frozen=True)
class _Workspaces:
    """FlashInfer's scratch buffers: float and int on the device, and the pinned host mirror plans are staged in."""

    float_buffer: torch.Tensor
    int_buffer: torch.Tensor
    pinned_int_buffer: torch.Tensor


_WORKSPACES: dict[torch.device, _Workspaces] = {}


def _shared_workspaces(device: torch.device) -> _Workspaces:
    """One set of workspaces per device for the whole process, never freed (why: ``_share_workspace``)."""
    if device.index is None:
        device = torch.device(device.type, torch.cuda.current_device())
    workspaces = _WORKSPACES.get(device)
    if workspaces is None:
        workspaces = _Workspaces(
            torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device),
            torch.zeros(INT_WORKSPACE_BYTES, dtype=torch.uint8, device=device),
            torch.empty(INT_WORKSPACE_BYTES, dtype=torch.uint8, pin_memory=True),
        )
        _WORKSPACES[device] = workspaces
    return workspaces


@dataclass
class _DecodeWrapper:
    """A planned decode wrapper and the static buffers its plan reads."""

    wrapper: flashinfer.BatchDecodeWithPagedKVCacheWrapper
    kv_indices: torch.Tensor
    """[batch_size * graph_width + 1] int32; the last element is a dump target for masked-out entries."""


class FlashInferAttentionBackend(TorchAttentionBackend):
    """Decode through FlashInfer (graph-safe wrappers per batch size); extend inherited from the torch backend."""

    name = "flashinfer"
    needs_seq_lens_cpu = True
    """``plan`` builds the index pointers on the host from the lengths."""

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        kv_pool: TokenToKVPool,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float | None = None,
    ) -> None:
        super().__init__(req_to_token_pool, kv_pool, num_heads, num_kv_heads, head_dim, scale)
        device = self.req_to_token.device
        if device.type != "cuda":
            raise ValueError(f"the flashinfer attention backend needs a CUDA device, not {device}; use 'torch'")
        self._workspaces = _shared_workspaces(device)
        self._workspace = self._workspaces.float_buffer
        self._eager = _DecodeWrapper(
            self._share_workspace(flashinfer.BatchDecodeWithPagedKVCacheWrapper(self._workspace, "NHD")),
            torch.empty(0, dtype=torch.int32, device=device),
        )
        self._graph_wrappers: dict[int, _DecodeWrapper] = {}
        self.decode_wrapper: _DecodeWrapper | None = None

    # -- metadata ---------------------------------------------------------------------------------------------------

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Eager decode plans the eager wrapper; inside a capture the hook already planned the graph wrapper."""
        if not batch.forward_mode.is_decode():
            batch.attn_metadata = None
            return
        if is_capture_mode() and self.decode_wrapper is not None:
            return
        seq_lens_cpu = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens.cpu()
        width = max(int(seq_lens_cpu.max()), 1) if batch.batch_size else 1
        self._eager.kv_indices = torch.empty(
            batch.batch_size * width + 1, dtype=torch.int32, device=self.req_to_token.device
        )
        self._plan(self._eager, batch.req_pool_indices, batch.seq_lens, seq_lens_cpu, width)
        self.decode_wrapper = self._eager

    def _share_workspace(
        self, wrapper: flashinfer.BatchDecodeWithPagedKVCacheWrapper
    ) -> flashinfer.BatchDecodeWithPagedKVCacheWrapper:
        """Point ``wrapper`` at the process's shared workspaces (every wrapper is re-planned right before it runs,
        so one set serves them all).

        The device buffers go through the public ``reset_workspace_buffer``. That method also gives the wrapper a
        fresh pinned host buffer, which plans stage their copies in; it is swapped for the shared one before any
        plan has used it, the one place this module sets a FlashInfer attribute directly. Why: a pinned buffer that
        async plan copies used must never be freed, as torch's pool-aware host allocator does not survive that when
        a graph capture begins afterwards; per-wrapper buffers would be freed with their wrapper at shutdown.
        """
        wrapper.reset_workspace_buffer(self._workspaces.float_buffer, self._workspaces.int_buffer)
        wrapper._pin_memory_int_workspace_buffer = self._workspaces.pinned_int_buffer
        return wrapper

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Nothing shared to allocate: each batch size gets its own wrapper when it is captured."""

    def _graph_wrapper(self, batch_size: int) -> _DecodeWrapper:
        entry = self._graph_wrappers.get(batch_size)
        if entry is None:
            device = self.req_to_token.device
            kv_indices = torch.zeros(batch_size * self.graph_width + 1, dtype=torch.int32, device=device)
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=torch.zeros(batch_size + 1, dtype=torch.int32, device=device),
                paged_kv_indices_buffer=kv_indices,
                paged_kv_last_page_len_buffer=torch.ones(batch_size, dtype=torch.int32, device=device),
            )
            entry = _DecodeWrapper(self._share_workspace(wrapper), kv_indices)
            self._graph_wrappers[batch_size] = entry
        return entry

    def init_forward_metadata_capture_cuda_graph(
        self,
        batch_size: int,
        num_tokens: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        forward_mode: ForwardMode,
        **kwargs: object,
    ) -> None:
        """Decode: plan the wrapper of ``batch_size`` for the padding rows the capture runs with."""
        if not forward_mode.is_decode():
            self.decode_wrapper = None
            return
        seq_lens_cpu = seq_lens.cpu()  # capture time: a sync is fine here
        self.decode_wrapper = self._graph_wrapper(batch_size)
        self._plan(self.decode_wrapper, req_pool_indices, seq_lens, seq_lens_cpu, self.graph_width)

    def init_forward_metadata_replay_cuda_graph(
        self,
        batch_size: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_sum: int,
        forward_mode: ForwardMode,
        seq_lens_cpu: torch.Tensor | None = None,
        **kwargs: object,
    ) -> None:
        """Decode: re-plan the wrapper of ``batch_size`` for this step's lengths (host work, no device sync)."""
        if not forward_mode.is_decode():
            self.decode_wrapper = None
            return
        if seq_lens_cpu is None:
            seq_lens_cpu = seq_lens.cpu()
        self.decode_wrapper = self._graph_wrapper(batch_size)
        self._plan(self.decode_wrapper, req_pool_indices, seq_lens, seq_lens_cpu, self.graph_width)

    def _plan(
        self,
        entry: _DecodeWrapper,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        width: int,
    ) -> None:
        """Lay each row's slots out back to back in ``entry.kv_indices`` (device ops, fixed shapes) and plan."""
        rows = int(seq_lens_cpu.numel())
        indptr_cpu = torch.zeros(rows + 1, dtype=torch.int32)
        torch.cumsum(seq_lens_cpu.to(torch.int32), 0, out=indptr_cpu[1:])
        slots = self.req_to_token[:, :width].index_select(0, req_pool_indices)
        positions = self._positions[None, :width]
        starts = torch.cumsum(seq_lens, 0, dtype=torch.int64) - seq_lens
        dump = entry.kv_indices.numel() - 1
        targets = torch.where(positions < seq_lens[:, None], starts[:, None] + positions, dump)
        entry.kv_indices.scatter_(0, targets.reshape(-1), slots.reshape(-1))
        total = int(indptr_cpu[-1])
        entry.wrapper.plan(
            indptr_cpu,
            entry.kv_indices[:total],
            torch.ones(rows, dtype=torch.int32),
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            1,
            q_data_type=self.kv_pool.dtype,
            kv_data_type=self.kv_pool.dtype,
            sm_scale=self.scale,
            # One CTA per row, whatever the batch: a padded graph batch then computes each real row exactly as the
            # eager batch does (split-kv would partition differently for the bucket size and round differently).
            disable_split_kv=True,
        )

    # -- compute ----------------------------------------------------------------------------------------------------

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        output: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
        kv_stored: bool = False,
    ) -> None:
        """Store keys and values (unless ``kv_stored``); decode through the planned wrapper, extend through the
        torch path."""
        if batch.forward_mode.is_extend():
            super().forward(q, k, v, output, layer_id, batch, kv_stored=kv_stored)
            return
        if not kv_stored:
            self.store_kv(k, v, layer_id, batch.out_cache_loc)
        assert self.decode_wrapper is not None, "init_forward_metadata was not called for this decode step"
        query, paged_kv, out = self._decode_views(q, output, layer_id)
        self.decode_wrapper.wrapper.run(query, paged_kv, out=out)

    def bind_forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        output: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
        kv_stored: bool = False,
    ) -> Callable[[], None] | None:
        """``forward(...)`` bound now, for a breakable replay: decode through a graph wrapper becomes that wrapper's
        kernel launch on views made once (the plan before each replay refills its buffers and plan info). ``None``
        for extend batches and the eager wrapper, which replay through the op."""
        entry = self.decode_wrapper
        if not batch.forward_mode.is_decode() or entry is None or self._graph_wrappers.get(q.shape[0]) is not entry:
            return None
        attend = bind_decode_run(entry.wrapper, *self._decode_views(q, output, layer_id))
        if kv_stored:
            return attend
        return _in_order(functools.partial(self.store_kv, k, v, layer_id, batch.out_cache_loc), attend)

    def _decode_views(
        self, q: torch.Tensor, output: torch.Tensor, layer_id: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The query, the layer's paged cache and the output as FlashInfer's decode takes them."""
        heads = (q.shape[0], self.num_heads, self.head_dim)
        # [slots, 2, Hkv, D] is FlashInfer's single-tensor NHD layout with a page size of 1.
        return q.view(heads), self.kv_pool.kv_buffer[layer_id].unsqueeze(2), output.view(heads)
