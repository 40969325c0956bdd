"""Attention with FlashInfer's paged kernels: decode through ``BatchDecodeWithPagedKVCacheWrapper``, extend (prefill,
chunked prefill) through ``BatchPrefillWithPagedKVCacheWrapper``, over pages of ``page_size`` tokens.

Extend uses one paged wrapper over each request's prefix and new tokens, causal, rather than SGLang's split (a ragged
wrapper for the new tokens over themselves, a paged one for the cached prefix, joined by ``cascade.merge_state``).
Why: the engine stores the step's keys and values with their own op *before* attention runs, so the new tokens are
already in their pages when the kernel reads them; one kernel then sees the whole context, there is no second kernel
and no merge (one launch and one plan per step instead of three), and a graph wrapper needs one set of static index
buffers per captured bucket, not two.

Plans are made on the host from host lengths, never inside a graph, and never wait on the device; the page tables
they read are gathered from the request-to-token table by device ops of fixed shape, which a decode graph captures
(the step's first ops, in ``init_forward_metadata``), so re-planning a decode graph launches nothing but the plan's
own copies. When a step is planned:

- eager: ``init_forward_metadata``;
- breakable and ``tc_piecewise`` replays (attention is the eager break): the runner's replay hook, for the real
  requests only, so the break computes exactly what eager computes;
- prefill ``full`` (attention inside the graph): one ``use_cuda_graph=True`` wrapper per captured token bucket, with
  static buffers for that bucket's request rows; the capture hook plans it once for capture, the replay hook re-plans
  it before every replay (padded requests own no tokens and one scratch page).

Every wrapper uses FlashInfer's ``fa2`` kernels with split-kv disabled: a padded graph batch then computes each real
row as eager does (no partition that depends on the batch), ``fa2``'s CUDA-graph planner keeps the kernel's tiling
fixed per captured shape, and no wrapper allocates the 64 MiB of index scratch the ``fa3`` path asks for.

A breakable capture binds each decode break to the graph wrapper's kernel launch
(``kernels.flashinfer.decode_attention``), so a replayed break skips FlashInfer's Python ``run`` as well as the op's
dispatch. FlashInfer's private attributes are read (and its pinned workspace set) only through
``kernels.flashinfer.private_api``, which names the FlashInfer releases it was proven on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import flashinfer
import torch

from cudagraph.backend_utils import is_capture_mode
from cudagraph.runner import ForwardBatch, ReplayMetadata

from ..kernels.flashinfer.decode_attention import bind_decode_run
from ..kernels.flashinfer.private_api import share_pinned_workspace
from .choice import FLASHINFER_HEAD_DIMS
from .paging import ExtendLengths, HostPages, lay_out_pages
from .torch_backend import CaptureBatch, TorchAttentionBackend

_FAST_DECODE_PLAN: Callable[..., None] | None = getattr(flashinfer.decode, "fast_decode_plan", None)
"""FlashInfer's ``plan`` for a graph wrapper whose buffers the graph fills (0.5 has it); None where it is absent."""

WORKSPACE_BYTES = 128 * 2**20
INT_WORKSPACE_BYTES = 8 * 2**20
PREFILL_KERNELS = "fa2"
"""FlashInfer's prefill implementation for every extend wrapper (why: the module docstring)."""

_WrapperT = TypeVar(
    "_WrapperT", flashinfer.BatchDecodeWithPagedKVCacheWrapper, flashinfer.BatchPrefillWithPagedKVCacheWrapper
)


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
    """[batch_size * pages_per_row + 1] int32 page ids; the last element is a dump target for masked-out entries."""
    page_counts: tuple[torch.Tensor, torch.Tensor] | None = None
    """A graph wrapper's static ``(indptr, last_page_len)`` device buffers, which its graph step writes itself
    (``lay_out_pages``); None for the eager wrapper, whose plan copies them."""
    planned: bool = False
    """Whether FlashInfer's full ``plan`` has run on the wrapper: ``fast_decode_plan`` reuses the module that plan
    loads, so it can only re-plan a wrapper planned once (a capture plans it)."""


@dataclass
class _ExtendWrapper:
    """A paged prefill wrapper and its page-id buffer (static for a graph wrapper, per step for the eager one)."""

    wrapper: flashinfer.BatchPrefillWithPagedKVCacheWrapper
    kv_indices: torch.Tensor
    """[request_rows * pages_per_row + 1] int32 page ids; the last element is a dump target for masked-out entries."""
    request_rows: int = 0
    """A ``use_cuda_graph=True`` wrapper's fixed request rows (0: the eager wrapper, planned for any batch)."""

    @property
    def in_graph(self) -> bool:
        """Whether this wrapper belongs to one captured bucket and runs inside its graph."""
        return self.request_rows > 0


class FlashInferAttentionBackend(TorchAttentionBackend):
    """Decode and extend through FlashInfer's paged wrappers (graph-safe wrappers per captured shape)."""

    name = "flashinfer"
    needs_seq_lens_cpu = True
    """``plan`` builds the index pointers on the host from the lengths."""
    captures_extend_attention = False
    """Prefill ``full`` is refused for now: the per-bucket ``use_cuda_graph=True`` prefill wrappers below are built
    and planned, but replaying their capture faulted on the H100 (``cudaErrorInvalidAddressSpace``, FlashInfer 0.5.3,
    torch 2.11), so no engine takes that path until it is proven; eager and breakable extend use the same kernels."""
    supports_verify = False
    """Speculative verify steps are refused (one ``ConfigError`` from the model runner): they would need a prefill
    wrapper planned per step with each request's causal tail, not built yet; the torch and Triton backends run them."""
    SUPPORTED_HEAD_DIMS = FLASHINFER_HEAD_DIMS
    """Head sizes FlashInfer 0.5.3 can merge split attention for (its decode planner may split whatever we ask)."""

    def _set_up(self) -> None:
        """Check the device, the head size and the page layout, then build the shared workspace and the eager
        wrappers (graph wrappers come per captured bucket)."""
        device = self.req_to_token.device
        if device.type != "cuda":
            raise ValueError(f"the flashinfer attention backend needs a CUDA device, not {device}; use 'torch'")
        head_dim, kv_pool = self.head_dim, self.kv_pool
        if head_dim not in self.SUPPORTED_HEAD_DIMS:
            raise ValueError(
                f"the flashinfer attention backend supports head_dim {', '.join(map(str, self.SUPPORTED_HEAD_DIMS))}; "
                f"this model has head_dim {head_dim}: use --attention-backend torch"
            )
        self.page_size = kv_pool.page_size
        if self.graph_width % self.page_size:
            raise ValueError(
                f"the request-to-token table's width {self.graph_width} is not whole pages of {self.page_size}; "
                "build ReqToTokenPool with the KV pool's page_size"
            )
        self.pages_per_row = self.graph_width // self.page_size
        """Columns of a page table: the pages one full request-to-token row spans."""
        self._plan_options: dict[str, object] = {
            "q_data_type": kv_pool.dtype,
            "kv_data_type": kv_pool.dtype,
            "sm_scale": self.scale,
            # One CTA per row, whatever the batch: a padded graph batch then computes each real row exactly as the
            # eager batch does (split-kv would partition differently for the bucket size and round differently).
            "disable_split_kv": True,
        }
        """The keyword arguments of every ``plan`` (decode's and extend's)."""
        self._workspaces = _shared_workspaces(device)
        self._workspace = self._workspaces.float_buffer
        self._eager = _DecodeWrapper(
            self._share_workspace(flashinfer.BatchDecodeWithPagedKVCacheWrapper(self._workspace, "NHD")),
            torch.empty(0, dtype=torch.int32, device=device),
        )
        self._eager_extend = _ExtendWrapper(
            self._share_workspace(
                flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD", backend=PREFILL_KERNELS)
            ),
            torch.empty(0, dtype=torch.int32, device=device),
        )
        self._graph_wrappers: dict[int, _DecodeWrapper] = {}
        self._graph_extend_wrappers: dict[int, _ExtendWrapper] = {}
        """Prefill ``full`` wrappers by captured token count."""
        self.decode_wrapper: _DecodeWrapper | None = None

    # -- metadata ---------------------------------------------------------------------------------------------------

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Eager steps plan the eager wrapper. Inside a capture, or a ``tc_piecewise`` replay (which runs the forward
        in capture mode), the runner's hooks already planned and set the batch's metadata: it is left alone."""
        if batch.forward_mode.is_extend():
            if not is_capture_mode():
                batch.attn_metadata = self._plan_eager_extend(batch) if batch.batch_size else None
            return
        if not batch.forward_mode.is_decode():
            batch.attn_metadata = None
            return
        if is_capture_mode() and self.decode_wrapper is not None:
            if self.decode_wrapper is not self._eager:
                # A graph step lays out its page ids, indptr and last-page lengths here, inside the graph (or its
                # first segment), from the static request rows and lengths: the replay hook then plans on the host
                # only, with no device ops and no copies.
                self._lay_out(self.decode_wrapper, batch.req_pool_indices, batch.seq_lens, self.pages_per_row)
            return
        seq_lens_cpu = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens.cpu()
        width = max(int(seq_lens_cpu.max()), 1) if batch.batch_size else 1
        pages = -(-width // self.page_size)
        self._eager.kv_indices = torch.empty(
            batch.batch_size * pages + 1, dtype=torch.int32, device=self.req_to_token.device
        )
        self._plan(self._eager, batch.req_pool_indices, batch.seq_lens, seq_lens_cpu, pages)
        self.decode_wrapper = self._eager

    def _share_workspace(self, wrapper: _WrapperT) -> _WrapperT:
        """Point ``wrapper`` at the process's shared workspaces (every wrapper is re-planned right before it runs,
        so one set serves them all).

        The device buffers go through the public ``reset_workspace_buffer``. That method also gives the wrapper a
        fresh pinned host buffer, which plans stage their copies in; it is swapped for the shared one before any
        plan has used it, through the adapter of FlashInfer's private attributes
        (``kernels.flashinfer.private_api``), which fails plainly where the attribute is not FlashInfer 0.5's. Why:
        a pinned buffer that async plan copies used must never be freed, as torch's pool-aware host allocator does
        not survive that when a graph capture begins afterwards; per-wrapper buffers would be freed with their
        wrapper at shutdown.
        """
        wrapper.reset_workspace_buffer(self._workspaces.float_buffer, self._workspaces.int_buffer)
        share_pinned_workspace(wrapper, self._workspaces.pinned_int_buffer)
        return wrapper

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Nothing shared to allocate: each captured shape gets its own wrapper when it is captured."""

    def _graph_wrapper(self, batch_size: int) -> _DecodeWrapper:
        entry = self._graph_wrappers.get(batch_size)
        if entry is None:
            device = self.req_to_token.device
            kv_indices = torch.zeros(batch_size * self.pages_per_row + 1, dtype=torch.int32, device=device)
            indptr = torch.zeros(batch_size + 1, dtype=torch.int32, device=device)
            last_page_len = torch.ones(batch_size, dtype=torch.int32, device=device)
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=indptr,
                paged_kv_indices_buffer=kv_indices,
                paged_kv_last_page_len_buffer=last_page_len,
            )
            entry = _DecodeWrapper(self._share_workspace(wrapper), kv_indices, (indptr, last_page_len))
            self._graph_wrappers[batch_size] = entry
        return entry

    def _graph_extend_wrapper(self, num_tokens: int, request_rows: int) -> _ExtendWrapper:
        entry = self._graph_extend_wrappers.get(num_tokens)
        if entry is None:
            device = self.req_to_token.device
            kv_indices = torch.zeros(request_rows * self.pages_per_row + 1, dtype=torch.int32, device=device)
            wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                self._workspace,
                "NHD",
                use_cuda_graph=True,
                qo_indptr_buf=torch.zeros(request_rows + 1, dtype=torch.int32, device=device),
                paged_kv_indptr_buf=torch.zeros(request_rows + 1, dtype=torch.int32, device=device),
                paged_kv_indices_buf=kv_indices,
                paged_kv_last_page_len_buf=torch.ones(request_rows, dtype=torch.int32, device=device),
                backend=PREFILL_KERNELS,
            )
            entry = _ExtendWrapper(self._share_workspace(wrapper), kv_indices, request_rows)
            self._graph_extend_wrappers[num_tokens] = entry
        elif entry.request_rows != request_rows:
            raise ValueError(
                f"the graph of {num_tokens} tokens was captured with {entry.request_rows} request rows, "
                f"not {request_rows}"
            )
        return entry

    def _capture_metadata(self, capture: CaptureBatch) -> None:
        """Decode: plan the wrapper of ``batch_size`` for the padding rows the capture runs with.

        Extend (``forward_batch`` is the static batch about to be captured): with ``attention_in_graph=True``
        (prefill ``full``) plan the wrapper of ``num_tokens`` tokens and ``batch_size`` request rows for a stand-in
        batch that fills the bucket (that plan fixes the kernel's tiling for the graph); otherwise attention is an
        eager break and the all-padding capture batch has nothing to attend."""
        forward_mode, batch_size, num_tokens = capture.forward_mode, capture.batch_size, capture.num_tokens
        if forward_mode.is_extend():
            self.decode_wrapper = None
            batch = capture.options.get("forward_batch")
            if not isinstance(batch, ForwardBatch):
                raise TypeError("the extend capture hook needs forward_batch=<the static ForwardBatch>")
            batch.attn_metadata = None
            if capture.options.get("attention_in_graph"):
                entry = self._graph_extend_wrapper(num_tokens, batch_size)
                stand_in = ExtendLengths([num_tokens - batch_size + 1] + [1] * (batch_size - 1), [1] * batch_size)
                self._plan_extend(entry, capture.req_pool_indices, capture.seq_lens, stand_in)
                batch.attn_metadata = entry
            return
        if not forward_mode.is_decode():
            self.decode_wrapper = None
            return
        seq_lens_cpu = capture.seq_lens.cpu()  # capture time: a sync is fine here
        self.decode_wrapper = self._graph_wrapper(batch_size)
        indices, seq_lens = capture.req_pool_indices, capture.seq_lens
        self._plan(self.decode_wrapper, indices, seq_lens, seq_lens_cpu, self.pages_per_row, lay_out=False)

    def init_forward_metadata_replay_cuda_graph(self, metadata: ReplayMetadata) -> None:
        """Decode: re-plan the wrapper of ``metadata.batch_size`` rows for this step's lengths (host work, no device
        sync).

        Extend (``metadata.forward_batch`` is the runner's static batch, its host fields already this step's): with
        ``attention_in_graph`` re-plan the bucket's graph wrapper for the real requests padded to ``batch_size``
        rows; otherwise plan the eager wrapper the attention break runs, for the real requests."""
        forward_mode, batch_size = metadata.forward_mode, metadata.batch_size
        if forward_mode.is_extend():
            self.decode_wrapper = None
            batch = metadata.forward_batch
            if not isinstance(batch, ForwardBatch):
                raise TypeError("the extend replay hook needs ReplayMetadata.forward_batch=<the static ForwardBatch>")
            if metadata.attention_in_graph:
                entry = self._graph_extend_wrapper(batch.num_tokens, batch_size)
                lengths = ExtendLengths.of(batch, padded_rows=batch_size - batch.batch_size)
                self._plan_extend(entry, metadata.req_pool_indices, metadata.seq_lens, lengths)
                batch.attn_metadata = entry
            else:
                batch.attn_metadata = self._plan_eager_extend(batch) if batch.batch_size else None
            return
        if not forward_mode.is_decode():
            self.decode_wrapper = None
            return
        seq_lens_cpu = metadata.seq_lens_cpu
        if seq_lens_cpu is None:
            seq_lens_cpu = metadata.seq_lens.cpu()
        self.decode_wrapper = self._graph_wrapper(batch_size)
        self._replan(self.decode_wrapper, seq_lens_cpu)

    def _replan(self, entry: _DecodeWrapper, seq_lens_cpu: torch.Tensor) -> None:
        """Re-plan a captured graph wrapper for this step's host lengths: host work only. Its graph step writes the
        page ids, ``indptr`` and last-page lengths itself (``init_forward_metadata``), so FlashInfer's
        ``fast_decode_plan`` replaces ``plan`` and its copies of them (after one full ``plan``, which a capture
        runs: the fast one reuses the module the full one loads)."""
        host = HostPages.of(seq_lens_cpu, self.page_size)
        if _FAST_DECODE_PLAN is None or not entry.planned:
            self._plan_with(entry.wrapper.plan, entry, host)
            entry.planned = True
        else:
            plan = functools.partial(_FAST_DECODE_PLAN, entry.wrapper, global_override_indptr_cpu=host.indptr)
            self._plan_with(plan, entry, host)

    def _plan(
        self,
        entry: _DecodeWrapper,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        pages_per_row: int,
        *,
        lay_out: bool = True,
    ) -> None:
        """Plan decode over ``entry.kv_indices``, filling it with each row's pages first when ``lay_out`` (a graph
        wrapper's pages are laid out inside the captured step instead: ``init_forward_metadata``).

        The plan reads the host lengths only; what it copies of the page ids is the buffer onto itself."""
        host = HostPages.of(seq_lens_cpu, self.page_size)
        if lay_out:
            self._lay_out(entry, req_pool_indices, seq_lens, pages_per_row)
        self._plan_with(entry.wrapper.plan, entry, host)
        entry.planned = True

    def _plan_with(self, plan: Callable[..., None], entry: _DecodeWrapper, host: HostPages) -> None:
        """Call ``plan`` (a wrapper's ``plan`` or the bound ``fast_decode_plan``) with this backend's heads, dtypes
        and scale over ``entry``'s page ids."""
        plan(*self._paged_layout(entry.kv_indices, host), **self._plan_options)

    def _paged_layout(self, kv_indices: torch.Tensor, host: HostPages) -> tuple[object, ...]:
        """The positional arguments every ``plan`` here shares after the queries' ``indptr`` (extend's): the pages
        of each row (``host`` over ``kv_indices``), then this backend's heads, head size and page size."""
        return (
            host.indptr, kv_indices[: host.total], host.last_page_len,
            self.num_heads, self.num_kv_heads, self.head_dim, self.page_size,
        )  # fmt: skip

    def _lay_out(
        self, entry: _DecodeWrapper, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, pages_per_row: int
    ) -> None:
        """Write each row's page ids into ``entry.kv_indices``, and a graph wrapper's ``indptr`` and last-page
        lengths into its static buffers (device ops of fixed shape)."""
        lay_out_pages(
            entry.kv_indices, self.req_to_token, req_pool_indices, seq_lens, self.page_size, pages_per_row,
            entry.page_counts,
        )  # fmt: skip

    def _plan_eager_extend(self, batch: ForwardBatch) -> _ExtendWrapper:
        """Plan the eager extend wrapper for ``batch``'s real requests (host lengths; no device sync)."""
        rows = batch.batch_size
        lengths = ExtendLengths.of(batch)
        pages = sum(-(-n // self.page_size) for n in lengths.context_tokens)
        entry = self._eager_extend
        entry.kv_indices = torch.empty(pages + 1, dtype=torch.int32, device=self.req_to_token.device)
        self._plan_extend(entry, batch.req_pool_indices[:rows], batch.seq_lens[:rows], lengths)
        return entry

    def _plan_extend(
        self, entry: _ExtendWrapper, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, lengths: ExtendLengths
    ) -> None:
        """Fill ``entry.kv_indices`` with each row's pages and plan causal attention of its new tokens over them.

        ``seq_lens`` (device) must hold ``lengths.context_tokens``: the device side lays the pages out, the host side
        says where each row's pages and queries start."""
        host = lengths.host_pages(self.page_size)
        lay_out_pages(
            entry.kv_indices, self.req_to_token, req_pool_indices, seq_lens, self.page_size, self.pages_per_row
        )
        entry.wrapper.plan(
            lengths.qo_indptr(), *self._paged_layout(entry.kv_indices, host), causal=True, **self._plan_options
        )

    # -- compute ----------------------------------------------------------------------------------------------------

    def _paged_kv(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s cache as FlashInfer's single-tensor NHD layout ``[pages, 2, page_size, Hkv, D]``."""
        return self.kv_pool.kv_pages[layer_id].transpose(1, 2)

    def _attend(self, q: torch.Tensor, output: torch.Tensor, layer_id: int, batch: ForwardBatch) -> None:
        """Attend through the planned decode or extend wrapper."""
        if batch.forward_mode.is_extend():
            self._extend_paged(q, output, layer_id, batch)
            return
        assert self.decode_wrapper is not None, "init_forward_metadata was not called for this decode step"
        query, paged_kv, out = self._decode_views(q, output, layer_id)
        self.decode_wrapper.wrapper.run(query, paged_kv, out=out)

    def _extend_paged(self, q: torch.Tensor, output: torch.Tensor, layer_id: int, batch: ForwardBatch) -> None:
        """Extend attention (the new tokens' keys and values already in their pages): one causal paged kernel runs
        over each request's whole context. Token rows no request owns (bucket padding) come out as zeros."""
        entry = batch.attn_metadata
        if not isinstance(entry, _ExtendWrapper):
            # No real request (a breakable capture's all-padding batch): nothing attends.
            output.zero_()
            return
        rows = q.shape[0]
        if entry.in_graph:
            output.zero_()  # the kernel writes only the rows real requests own; the rest of the bucket stays zero
            real_rows = rows
        else:
            real_rows = sum(batch.extend_seq_lens_cpu or ())
            if real_rows < rows:
                output[real_rows:].zero_()
        shape = (real_rows, self.num_heads, self.head_dim)
        entry.wrapper.run(q[:real_rows].view(shape), self._paged_kv(layer_id), out=output[:real_rows].view(shape))

    def _bind_attend(
        self, q: torch.Tensor, output: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> Callable[[], None] | None:
        """Decode through a graph wrapper bound now, for a breakable replay: that wrapper's kernel launch on views made
        once (the plan before each replay refills its buffers and plan info). ``None`` for extend batches and the
        eager wrapper, which replay through the op."""
        entry = self.decode_wrapper
        if not batch.forward_mode.is_decode() or entry is None or self._graph_wrappers.get(q.shape[0]) is not entry:
            return None
        return bind_decode_run(entry.wrapper, *self._decode_views(q, output, layer_id))

    def _decode_views(
        self, q: torch.Tensor, output: torch.Tensor, layer_id: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The query, the layer's paged cache and the output as FlashInfer's decode takes them."""
        heads = (q.shape[0], self.num_heads, self.head_dim)
        return q.view(heads), self._paged_kv(layer_id), output.view(heads)
