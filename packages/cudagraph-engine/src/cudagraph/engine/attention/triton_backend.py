"""The ``triton`` attention backend: paged attention in one Triton kernel a layer, for decode and for extend (prefill);
the kernels are ``cudagraph.engine.kernels.triton``'s, this module is their graph-facing side.

Decode needs no metadata at all: the kernel reads each row's slots from the request-to-token table and its length
from ``seq_lens`` on the device, so a step builds nothing before its first layer, a full graph captures one launch a
layer, and a replay has nothing to plan (FlashInfer re-plans its wrapper on the host every step; the torch backend
fills three static tables on the device). A breakable capture binds each decode break to that one launch, through the
compiled kernel's C launcher rather than Triton's JIT call.

Extend is one Triton kernel a layer too (``extend_attention``): blocks of a request's new tokens, each token attending
to its request's row of the table up to its own position (the table already holds the new tokens' slots, whose keys and
values are stored before attention). The blocks are laid out on the device from the batch's fixed-size tensors
(``extend_attention.extend_rows``), once a step, so extend needs no host metadata either and is captured inside a graph:
prefill ``full``. Triton ships with every CUDA build of torch; the backend runs on CPU tensors only under
``TRITON_INTERPRET=1``.

A speculative verify step (``query_len`` tokens a request, each attending up to its own position) is an extend step
whose requests all have ``query_len`` new tokens, so it runs the extend kernel on rows laid out from its shapes alone
(``extend_attention.uniform_extend_batch``): captured inside the verify runner's full graphs like a decode step.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from cudagraph.runner import ForwardBatch, ReplayMetadata

from ..kernels.triton.decode_attention import DecodeRows, PagedDecodeKernel
from ..kernels.triton.extend_attention import ExtendRows, PagedExtendKernel, uniform_extend_batch
from .torch_backend import CaptureBatch, TorchAttentionBackend


class TritonAttentionBackend(TorchAttentionBackend):
    """Grouped-query attention over the paged cache in one Triton launch a layer, decode and extend alike; extend
    attention is captured inside graphs too (prefill ``full``)."""

    name = "triton"
    captures_extend_attention = True
    """Extend needs no host metadata (``extend_attention.extend_rows`` runs on the device), so prefill ``full`` can
    capture it."""
    supports_verify = True
    """Verify steps run the extend kernel over rows made from the step's shapes (eager and inside full graphs)."""

    def _check_device(self, device: torch.device) -> None:
        """A CUDA device, or CPU tensors under ``TRITON_INTERPRET=1``."""
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                f"the triton attention backend needs a CUDA device, not {device} (TRITON_INTERPRET=1 runs its kernel "
                "on CPU tensors, slowly); use 'torch'"
            )

    def _set_up(self) -> None:
        """The decode kernel, its scratch reserved for a full request-to-token table, and the extend kernel."""
        self.decode_kernel = PagedDecodeKernel(
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.scale,
            max_context=self.graph_width,
            device=self.req_to_token.device,
        )
        self.decode_kernel.reserve(int(self.req_to_token.shape[0]))
        self.extend_kernel = PagedExtendKernel(self.num_heads, self.num_kv_heads, self.head_dim, self.scale)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Decode: nothing (the kernel reads the batch's tables on the device). Extend and verify: the batch's
        ``ExtendRows``, made on the device (inside a capture, part of the graph)."""
        self.forward_metadata = None
        batch.attn_metadata = None if batch.forward_mode.is_decode() else self._rows_of(batch)

    def _rows_of(self, batch: ForwardBatch) -> ExtendRows:
        """The extend kernel's rows of an extend or verify batch."""
        return self.extend_kernel.rows_of(uniform_extend_batch(batch) if batch.forward_mode.is_verify() else batch)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Room in the decode kernel's scratch for ``max_bs`` rows (captured launches cannot allocate; extend needs
        no scratch)."""
        self.decode_kernel.reserve(max_bs)

    def _capture_metadata(self, capture: CaptureBatch) -> None:
        """Nothing: a captured decode reads the runner's static ``req_pool_indices`` and ``seq_lens``."""
        self.forward_metadata = None

    def init_forward_metadata_replay_cuda_graph(self, metadata: ReplayMetadata) -> None:
        """Nothing: the runner has copied the step into the static tensors the captured launches read."""
        self.forward_metadata = None

    def _attend(self, q: torch.Tensor, output: torch.Tensor, layer_id: int, batch: ForwardBatch) -> None:
        """One launch: a row per request (decode) or per block of a request's new tokens (extend and verify, its
        ``ExtendRows`` made on first use in the step)."""
        kv_buffer = self.kv_pool.kv_buffer[layer_id]
        if batch.forward_mode.is_decode():
            self.decode_kernel(q, kv_buffer, output, self.req_to_token, _decode_rows(batch))
            return
        rows = batch.attn_metadata
        if not isinstance(rows, ExtendRows):
            # A breakable replay's eager breaks: the runner cleared the metadata its capture made.
            rows = batch.attn_metadata = self._rows_of(batch)
        self.extend_kernel(q, kv_buffer, output, self.req_to_token, rows)

    def _bind_attend(
        self, q: torch.Tensor, output: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> Callable[[], None] | None:
        """The layer's launch with every argument bound now, straight to the compiled kernel's launcher (a breakable
        capture's batch tensors are the runner's static ones). Extend binds the batch's ``ExtendRows`` made inside
        the capture (``init_forward_metadata`` in the graph segment before the first layer, which remakes them at
        every replay); ``None`` where the batch has none, so replay calls the op."""
        kv_buffer = self.kv_pool.kv_buffer[layer_id]
        if batch.forward_mode.is_decode():
            return self.decode_kernel.bind(q, kv_buffer, output, self.req_to_token, _decode_rows(batch))
        if isinstance(batch.attn_metadata, ExtendRows):
            return self.extend_kernel.bind(q, kv_buffer, output, self.req_to_token, batch.attn_metadata)
        return None


def _decode_rows(batch: ForwardBatch) -> DecodeRows:
    """The decode kernel's rows of ``batch``: its table rows and lengths, read on the device."""
    return DecodeRows(batch.req_pool_indices, batch.seq_lens)
