"""Attention in plain torch over the paged KV cache: works on CPU and GPU, and inside graphs.

Decode is graph-safe: its metadata (each row's KV slots and an additive mask hiding the slots past its length) lives
in static buffers as wide as the request-to-token table, filled once per step by device-only ops, so a captured step
has no host syncs and no shapes that depend on tensor values. Extend (prefill) attention loops over the requests on
the host; it runs eagerly, also inside breakable and piecewise graphs, where it is the break.

A breakable capture binds each decode break once (``bind_forward``): the gather, the fused attention and the copy
into the output, on views made at capture, so a replayed break runs three kernel launches and no other Python.

A verify step of speculative decoding (``query_len`` tokens per request: the last token and the drafts) is decode
with a causal tail: token ``i`` of a request of ``seq_len`` tokens sees slots ``0 .. seq_len - query_len + i``. Its
metadata is decode's plus a ``[B, query_len, L]`` mask, filled the same way (device-only ops into static views at
capture), so a verify step is captured whole in a full graph.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cudagraph.backend_utils import is_capture_mode
from cudagraph.runner import ForwardBatch, ForwardMode, ReplayMetadata

from ..kv_cache import ReqToTokenPool, TokenToKVPool


@dataclass(frozen=True)
class CaptureBatch:
    """The arguments of the runner's capture hook (``init_forward_metadata_capture_cuda_graph``): the batch of one
    bucket about to be captured."""

    batch_size: int
    num_tokens: int
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    forward_mode: ForwardMode
    options: Mapping[str, object]
    """The hook's keyword arguments (``forward_batch``, ``attention_in_graph``: an extend capture's)."""


@dataclass(frozen=True)
class DecodeMetadata:
    """Per decode row: the KV slots of its first ``L`` tokens and which of them belong to the request."""

    kv_slots: torch.Tensor
    """[B, L] int32 slot of token ``j`` of row ``b`` (the scratch slot past its length)."""
    kv_valid: torch.Tensor
    """[B, L] bool ``j < seq_len[b]``."""
    kv_bias: torch.Tensor
    """[B, L] in the cache dtype: 0 where ``kv_valid``, ``-inf`` elsewhere (the SDPA mask, built once per step)."""


@dataclass(frozen=True)
class VerifyMetadata:
    """Per verify row: its KV slots (as in decode) and, per query token, which of them it sees."""

    kv_slots: torch.Tensor
    """[B, L] int32 slot of token ``j`` of row ``b``."""
    last_visible: torch.Tensor
    """[B, Q] int64 the last slot index query token ``i`` sees (``seq_len - Q + i``, at least 0: a padded row's
    queries see the scratch slot, so their softmax stays finite)."""
    kv_bias: torch.Tensor
    """[B, Q, L] float32: 0 where token ``i`` sees slot ``j``, ``-inf`` elsewhere."""

    @property
    def query_len(self) -> int:
        """Tokens per request (``Q``)."""
        return int(self.last_visible.shape[1])


@dataclass(frozen=True)
class ExtendRequest:
    """One request of an extend batch: where its new tokens sit and which KV slots it attends to."""

    start: int
    num_new: int
    kv_slots: torch.Tensor
    """[prefix + num_new] slots, in token order."""
    causal_mask: torch.Tensor
    """[num_new, prefix + num_new] bool: new token ``i`` sees tokens ``0 .. prefix + i``."""


@dataclass(frozen=True)
class ExtendMetadata:
    """An extend batch's requests (the real ones; padded token rows past ``num_real_tokens`` get zeros)."""

    requests: tuple[ExtendRequest, ...]
    num_real_tokens: int


class TorchAttentionBackend:
    """Grouped-query attention over ``TokenToKVPool`` with ``ReqToTokenPool`` indirection, in plain torch."""

    name = "torch"
    needs_seq_lens_cpu = False
    """The replay hook only picks static views; the graph derives everything else on the device."""
    supports_verify = True
    """Runs speculative verify steps (``ForwardMode.TARGET_VERIFY``), eagerly and inside full graphs."""
    captures_extend_attention = False
    """Extend attention loops over the requests on the host (shapes follow each request's length), so it cannot be
    captured inside a graph: prefill ``full`` needs an attention backend whose extend can (``triton``)."""

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        kv_pool: TokenToKVPool,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float | None = None,
    ) -> None:
        self._check_device(req_to_token_pool.req_to_token.device)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}")
        self.req_to_token = req_to_token_pool.req_to_token
        self.graph_width = int(self.req_to_token.shape[1])
        """Columns of the static decode metadata: every slot a request can have (aligned for fused kernels)."""
        self.kv_pool = kv_pool
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
        self.forward_metadata: DecodeMetadata | None = None
        self.verify_metadata: VerifyMetadata | None = None
        """The metadata of the verify step being run (eager, captured or replayed)."""
        self._verify_views: dict[tuple[int, int], VerifyMetadata] = {}
        """Static verify metadata per (batch size, query length), made at capture, largest first: the smaller ones
        view its storage. Never dropped while the backend lives, since captured graphs read it."""
        self._graph_capacity = 0
        self._graph_views: dict[int, DecodeMetadata] = {}
        self._bound_gather: weakref.ref[torch.Tensor] | None = None
        """The gather buffer bound decode breaks share (alive while a bound break holds it)."""
        device = self.req_to_token.device
        self._positions = torch.arange(self.graph_width, device=device)
        self._no_bias = torch.zeros((), dtype=kv_pool.dtype, device=device)
        self._masked_bias = torch.full((), float("-inf"), dtype=kv_pool.dtype, device=device)
        self._no_bias_f32 = torch.zeros((), dtype=torch.float32, device=device)
        self._masked_bias_f32 = torch.full((), float("-inf"), dtype=torch.float32, device=device)
        self._set_up()

    def _check_device(self, device: torch.device) -> None:
        """Raise where this backend cannot run on ``device``, before anything is built (a backend of this family
        overrides it; plain torch runs anywhere)."""

    def _set_up(self) -> None:
        """Build what a backend of this family keeps beside the shared metadata state, last in ``__init__`` (plain
        torch keeps nothing more)."""

    # -- metadata ---------------------------------------------------------------------------------------------------

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Prepare a step. Eager decode sizes the metadata to the longest request (one host sync); inside a capture
        the static metadata the capture hook chose is filled in place, so the fill becomes part of the graph."""
        if batch.forward_mode.is_verify():
            self._init_verify_metadata(batch)
            return
        if not batch.forward_mode.is_decode():
            batch.attn_metadata = None  # extend metadata is built from the host-side lengths on first use
            return
        if is_capture_mode() and self.forward_metadata is not None:
            self._fill_decode_metadata(self.forward_metadata, batch.req_pool_indices, batch.seq_lens)
            return
        metadata = self._empty_metadata(batch.batch_size, self._eager_width(batch))
        self._fill_decode_metadata(metadata, batch.req_pool_indices, batch.seq_lens)
        self.forward_metadata = metadata

    def _eager_width(self, batch: ForwardBatch) -> int:
        """Columns of an eager step's metadata: its longest request (one host sync without host lengths), aligned
        like the table so SDPA needs no mask padding, at most the table's width."""
        lengths = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens
        longest = int(lengths.max()) if batch.batch_size else 1
        return min(-(-longest // 16) * 16, self.graph_width)

    def _init_verify_metadata(self, batch: ForwardBatch) -> None:
        query_len = batch.num_tokens // max(batch.batch_size, 1)
        metadata = self.verify_metadata
        if (
            is_capture_mode()
            and metadata is not None
            and metadata.kv_slots.shape[0] == batch.batch_size
            and metadata.query_len == query_len
        ):
            self._fill_verify_metadata(metadata, batch.req_pool_indices, batch.seq_lens)
            return
        metadata = self._empty_verify_metadata(batch.batch_size, query_len, self._eager_width(batch))
        self._fill_verify_metadata(metadata, batch.req_pool_indices, batch.seq_lens)
        self.verify_metadata = metadata

    def _empty_verify_metadata(self, rows: int, query_len: int, width: int) -> VerifyMetadata:
        device = self.req_to_token.device
        return VerifyMetadata(
            kv_slots=torch.zeros((rows, width), dtype=torch.int32, device=device),
            last_visible=torch.zeros((rows, query_len), dtype=torch.int64, device=device),
            kv_bias=torch.zeros((rows, query_len, width), dtype=torch.float32, device=device),
        )

    def _fill_verify_metadata(
        self, metadata: VerifyMetadata, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
    ) -> None:
        width = metadata.kv_slots.shape[1]
        query_len = metadata.query_len
        torch.index_select(self.req_to_token[:, :width], 0, req_pool_indices, out=metadata.kv_slots)
        # Query token i of a row of seq_len tokens sits at position seq_len - query_len + i and sees up to itself.
        offsets = self._positions[:query_len] - query_len
        torch.add(seq_lens[:, None], offsets[None, :], out=metadata.last_visible)
        metadata.last_visible.clamp_(min=0)
        visible = self._positions[None, None, :width] <= metadata.last_visible[:, :, None]
        torch.where(visible, self._no_bias_f32, self._masked_bias_f32, out=metadata.kv_bias)

    def _verify_view(self, batch_size: int, query_len: int) -> VerifyMetadata:
        """The static verify metadata of ``batch_size`` rows of ``query_len`` tokens (a capture of a larger size
        first makes the storage the smaller ones view)."""
        view = self._verify_views.get((batch_size, query_len))
        if view is not None:
            return view
        same_length = [m for (_, length), m in self._verify_views.items() if length == query_len]
        storage = max(same_length, key=lambda m: m.kv_slots.shape[0], default=None)
        if storage is None or storage.kv_slots.shape[0] < batch_size:
            storage = self._empty_verify_metadata(batch_size, query_len, self.graph_width)
        view = VerifyMetadata(
            storage.kv_slots[:batch_size], storage.last_visible[:batch_size], storage.kv_bias[:batch_size]
        )
        self._verify_views[(batch_size, query_len)] = view
        return view

    def _empty_metadata(self, rows: int, width: int) -> DecodeMetadata:
        device = self.req_to_token.device
        return DecodeMetadata(
            kv_slots=torch.zeros((rows, width), dtype=torch.int32, device=device),
            kv_valid=torch.zeros((rows, width), dtype=torch.bool, device=device),
            kv_bias=torch.zeros((rows, width), dtype=self.kv_pool.dtype, device=device),
        )

    def _fill_decode_metadata(
        self, metadata: DecodeMetadata, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
    ) -> None:
        width = metadata.kv_slots.shape[1]
        torch.index_select(self.req_to_token[:, :width], 0, req_pool_indices, out=metadata.kv_slots)
        torch.lt(self._positions[None, :width], seq_lens[:, None], out=metadata.kv_valid)
        torch.where(metadata.kv_valid, self._no_bias, self._masked_bias, out=metadata.kv_bias)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Static decode metadata for ``max_bs`` rows of ``graph_width`` columns.

        Only grows: views already handed to captured graphs keep the storage they were made from alive.
        """
        if max_bs <= self._graph_capacity:
            return
        self._graph_storage = self._empty_metadata(max_bs, self.graph_width)
        self._graph_capacity = max_bs

    def _graph_view(self, batch_size: int) -> DecodeMetadata:
        view = self._graph_views.get(batch_size)
        if view is None:
            if batch_size > self._graph_capacity:
                raise ValueError(
                    f"batch size {batch_size} exceeds the graph state ({self._graph_capacity} rows); "
                    "call init_cuda_graph_state with a larger max_bs first"
                )
            storage = self._graph_storage
            view = DecodeMetadata(
                storage.kv_slots[:batch_size], storage.kv_valid[:batch_size], storage.kv_bias[:batch_size]
            )
            self._graph_views[batch_size] = view
        return view

    def init_forward_metadata_capture_cuda_graph(
        self,
        batch_size: int,
        num_tokens: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        forward_mode: ForwardMode,
        **kwargs: object,
    ) -> None:
        """The runner's capture hook: its arguments as one ``CaptureBatch``, handed to ``_capture_metadata`` (the
        step every backend of this family overrides)."""
        self._capture_metadata(CaptureBatch(batch_size, num_tokens, req_pool_indices, seq_lens, forward_mode, kwargs))

    def _capture_metadata(self, capture: CaptureBatch) -> None:
        """Decode and verify: use the static view of ``capture.batch_size`` rows (filled inside the captured
        forward)."""
        if capture.forward_mode.is_verify():
            self.verify_metadata = self._verify_view(capture.batch_size, capture.num_tokens // capture.batch_size)
            return
        self.forward_metadata = self._graph_view(capture.batch_size) if capture.forward_mode.is_decode() else None

    def init_forward_metadata_replay_cuda_graph(self, metadata: ReplayMetadata) -> None:
        """Decode: point at the static view of ``metadata.batch_size`` rows; the graph refills it from the static
        inputs."""
        if metadata.forward_mode.is_verify():
            self.verify_metadata = self._verify_views[(metadata.batch_size, metadata.query_len)]
            return
        decode = metadata.forward_mode.is_decode()
        self.forward_metadata = self._graph_view(metadata.batch_size) if decode else None

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        """1: a padded row attends to exactly one token, the scratch slot, so its softmax stays finite."""
        return 1

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
        """Store this step's keys and values (unless ``kv_stored``), then write attention of ``q`` over the cache
        into ``output`` (``_attend``, the step every backend of this family overrides)."""
        if not kv_stored:
            self.store_kv(k, v, layer_id, batch.out_cache_loc)
        self._attend(q, output, layer_id, batch)

    def _attend(self, q: torch.Tensor, output: torch.Tensor, layer_id: int, batch: ForwardBatch) -> None:
        """Attention of ``q`` over the cache, which holds this step's keys and values already, into ``output``."""
        if batch.forward_mode.is_extend():
            self._extend(q, output, layer_id, batch)
        elif batch.forward_mode.is_verify():
            assert self.verify_metadata is not None, "init_forward_metadata was not called for this verify step"
            self._verify(q, output, layer_id, self.verify_metadata)
        else:
            assert self.forward_metadata is not None, "init_forward_metadata was not called for this decode step"
            self._decode(q, output, layer_id, self.forward_metadata)

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
        """``forward(q, k, v, output, layer_id, batch, kv_stored)`` bound now, for a breakable replay: a zero-argument
        callable with every lookup and view made once (the attention op's replay binder calls this at capture): the
        KV store (unless ``kv_stored``), then ``_bind_attend``'s launch; ``None`` where ``_bind_attend`` binds nothing,
        so replay calls the op."""
        attend = self._bind_attend(q, output, layer_id, batch)
        if attend is None or kv_stored:
            return attend
        return _in_order(*self.kv_pool.bind_store(layer_id, batch.out_cache_loc, k, v), attend)

    def _bind_attend(
        self, q: torch.Tensor, output: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> Callable[[], None] | None:
        """``_attend`` bound now (the step every backend of this family overrides). Here: decode over a graph's static
        metadata only, whose tensors stay where they are and are refilled every step; ``None`` otherwise (extend
        batches build host-side metadata per step, so they replay through the op)."""
        metadata = self.forward_metadata
        if not batch.forward_mode.is_decode() or not self._is_graph_view(metadata):
            return None
        assert metadata is not None
        return self._decode_call(q, output, layer_id, metadata, self._shared_gather_buffer(metadata.kv_slots.numel()))

    def _is_graph_view(self, metadata: DecodeMetadata | None) -> bool:
        return metadata is not None and self._graph_views.get(metadata.kv_slots.shape[0]) is metadata

    def kv_destination(self, layer_id: int, out_cache_loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Where ``store_kv`` writes layer ``layer_id``'s keys and values: ``(kv_buffer, slots)``, the layer's
        ``[slots, 2, Hkv, D]`` cache and the step's slots. A kernel that writes them there itself (the Triton
        kernel set's rotary) lets the attention op skip its store (``kv_stored=True``)."""
        return self.kv_pool.kv_buffer[layer_id], out_cache_loc

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, layer_id: int, out_cache_loc: torch.Tensor) -> None:
        """Write keys and values ``[T, Hkv*D]`` to their slots in one kernel where the model's projection keeps them
        side by side (``TokenToKVPool.store``; padded tokens all hit the scratch slot)."""
        self.kv_pool.store(layer_id, out_cache_loc, k, v)

    def _decode(self, q: torch.Tensor, output: torch.Tensor, layer_id: int, metadata: DecodeMetadata) -> None:
        self._decode_call(q, output, layer_id, metadata, self._gather_buffer(metadata.kv_slots.numel()))()

    def _gather_buffer(self, slots: int) -> torch.Tensor:
        """Room for ``slots`` gathered slots, keys and values side by side: ``[slots, 2, Hkv, D]``."""
        kv = self.kv_pool.kv_buffer[0]
        return torch.empty((slots, *kv.shape[1:]), dtype=kv.dtype, device=kv.device)

    def _shared_gather_buffer(self, slots: int) -> torch.Tensor:
        """A gather buffer of at least ``slots`` slots shared by every bound decode break (of every layer and shape:
        they run one after another on one stream). Graphs capture their largest shape first, so one buffer, as big as
        the gather the largest shape would allocate per call anyway, serves them all; it is freed with the last
        bound break that holds it."""
        buffer = self._bound_gather() if self._bound_gather is not None else None
        if buffer is None or buffer.shape[0] < slots:
            buffer = self._gather_buffer(slots)
            self._bound_gather = weakref.ref(buffer)
        # The breaks of the shape it was made for hold the buffer itself (and keep this reference alive); smaller
        # shapes hold a view of its first rows.
        return buffer if buffer.shape[0] == slots else buffer[:slots]

    def _decode_call(
        self, q: torch.Tensor, output: torch.Tensor, layer_id: int, metadata: DecodeMetadata, gathered: torch.Tensor
    ) -> Callable[[], None]:
        """Decode attention of ``q`` into ``output`` over ``metadata``, with every view made now (``gathered``:
        room for the gathered slots); calling the result launches the gather, the fused attention and the copy."""
        rows, width = metadata.kv_slots.shape
        # One gather fetches keys and values ([B*L, 2, Hkv, D]); each is seen as [B, Hkv, L, D] with the head dim
        # contiguous, which the fused kernels need.
        keys = gathered[:, 0].view(rows, width, self.num_kv_heads, self.head_dim)
        values = gathered[:, 1].view(rows, width, self.num_kv_heads, self.head_dim)
        groups = self.num_heads // self.num_kv_heads
        # The query heads sharing a kv head act as that head's query rows, so one fused SDPA call does grouped-query
        # decode with no repeated keys; the mask only hides slots past each row's length.
        grouped = (rows, self.num_kv_heads, groups, self.head_dim)
        return functools.partial(
            _gather_and_attend,
            self.kv_pool.kv_buffer[layer_id],
            metadata.kv_slots.view(-1),
            gathered,
            q.view(grouped),
            keys.transpose(1, 2),
            values.transpose(1, 2),
            metadata.kv_bias[:, None, None, :],
            self.scale,
            output.view(grouped),
        )

    def _verify(self, q: torch.Tensor, output: torch.Tensor, layer_id: int, metadata: VerifyMetadata) -> None:
        """Attention of ``query_len`` tokens per row over the row's slots, each token up to itself (in float32)."""
        rows, width = metadata.kv_slots.shape
        query_len = metadata.query_len
        groups = self.num_heads // self.num_kv_heads
        gathered = self.kv_pool.kv_buffer[layer_id].index_select(0, metadata.kv_slots.view(-1))
        keys = gathered[:, 0].view(rows, width, self.num_kv_heads, self.head_dim).permute(0, 2, 3, 1).float()
        values = gathered[:, 1].view(rows, width, self.num_kv_heads, self.head_dim).transpose(1, 2).float()
        # [B, Q, Hkv, G, D] -> [B, Hkv, G*Q, D]: a kv head's query heads and tokens as its query rows.
        queries = q.view(rows, query_len, self.num_kv_heads, groups, self.head_dim).permute(0, 2, 3, 1, 4)
        queries = queries.reshape(rows, self.num_kv_heads, groups * query_len, self.head_dim).float()
        scores = torch.matmul(queries, keys) * self.scale  # [B, Hkv, G*Q, L]
        scores = scores.view(rows, self.num_kv_heads, groups, query_len, width) + metadata.kv_bias[:, None, None]
        probs = torch.softmax(scores, dim=-1).view(rows, self.num_kv_heads, groups * query_len, width)
        result = torch.matmul(probs, values).view(rows, self.num_kv_heads, groups, query_len, self.head_dim)
        output.view(rows, query_len, self.num_kv_heads, groups, self.head_dim).copy_(result.permute(0, 3, 1, 2, 4))

    def _extend(self, q: torch.Tensor, output: torch.Tensor, layer_id: int, batch: ForwardBatch) -> None:
        metadata = batch.attn_metadata
        if not isinstance(metadata, ExtendMetadata):
            metadata = self._build_extend_metadata(batch)
            batch.attn_metadata = metadata
        groups = self.num_heads // self.num_kv_heads
        kv_cache = self.kv_pool.kv_buffer[layer_id]
        for request in metadata.requests:
            rows = slice(request.start, request.start + request.num_new)
            gathered = kv_cache.index_select(0, request.kv_slots)
            keys, values = gathered[:, 0], gathered[:, 1]
            queries = q[rows].view(request.num_new, self.num_kv_heads, groups, self.head_dim)
            scores = torch.einsum("nhgd,lhd->hgnl", queries, keys).float() * self.scale
            scores.masked_fill_(~request.causal_mask, float("-inf"))
            probs = torch.softmax(scores, dim=-1).to(values.dtype)
            result = torch.einsum("hgnl,lhd->nhgd", probs, values)
            output[rows] = result.reshape(request.num_new, -1)
        if metadata.num_real_tokens < output.shape[0]:
            output[metadata.num_real_tokens :].zero_()

    def _build_extend_metadata(self, batch: ForwardBatch) -> ExtendMetadata:
        if batch.extend_seq_lens_cpu is None or batch.extend_prefix_lens_cpu is None:
            raise ValueError("an extend batch needs extend_seq_lens_cpu and extend_prefix_lens_cpu")
        device = self.req_to_token.device
        requests = []
        start = 0
        for index, (num_new, prefix) in enumerate(
            zip(batch.extend_seq_lens_cpu, batch.extend_prefix_lens_cpu, strict=True)
        ):
            if num_new == 0:
                continue
            total = prefix + num_new
            row = self.req_to_token.index_select(0, batch.req_pool_indices[index : index + 1])[0, :total]
            positions = torch.arange(total, device=device)
            query_positions = torch.arange(prefix, total, device=device)
            causal = positions[None, :] <= query_positions[:, None]
            requests.append(ExtendRequest(start, num_new, row, causal))
            start += num_new
        return ExtendMetadata(tuple(requests), start)


def _gather_and_attend(
    kv_cache: torch.Tensor,
    slots: torch.Tensor,
    gathered: torch.Tensor,
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    output: torch.Tensor,
) -> None:
    # keys and values view ``gathered``: the gather refreshes them.
    torch.index_select(kv_cache, 0, slots, out=gathered)
    output.copy_(F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale))


def _in_order(*calls: Callable[[], object]) -> Callable[[], None]:
    """One zero-argument callable running ``calls`` in order."""

    def run() -> None:
        for call in calls:
            call()

    return run
