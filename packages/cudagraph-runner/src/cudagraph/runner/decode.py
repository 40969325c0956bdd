"""Decode graphs keyed by batch size: one token per request, padded up to the nearest captured batch size."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar

import torch

from cudagraph.config import Phase

from .base import BaseCudaGraphRunner
from .forward_batch import ForwardBatch, ForwardMode
from .static_buffers import DECODE_FIELDS, StaticInputs

_GRAPHED_MODES = frozenset({ForwardMode.DECODE, ForwardMode.IDLE})


class DecodeCudaGraphRunner(BaseCudaGraphRunner):
    """Replays decode (and idle) steps from graphs captured per batch size.

    A step: copy the batch into the static buffers (one fused copy per dtype, padding re-applied only when the batch
    shrank), let the attention backend refresh its static metadata, replay the padded bucket, return the logits view
    of the real batch made at capture. Batches it cannot take are run eagerly through ``model_runner.forward``.
    """

    phase: ClassVar[Phase] = Phase.DECODE

    def _allocate_static_buffers(self) -> None:
        attn_backend = self.model_runner.attn_backend
        self.inputs = StaticInputs.allocate(
            DECODE_FIELDS,
            max_tokens=self.max_size,
            max_requests=self.max_size,
            device=self.device,
            seq_len_fill_value=attn_backend.get_cuda_graph_seq_len_fill_value(),
        )
        self.inputs.mirror_seq_lens_cpu = getattr(attn_backend, "needs_seq_lens_cpu", True)
        attn_backend.init_cuda_graph_state(self.max_size, self.max_size)
        self._replay_attn_metadata = attn_backend.init_forward_metadata_replay_cuda_graph
        self._index_static_buckets(attn_backend)

    def _replay_reads_no_context(self) -> bool:
        return self.backend.captures_attn_metadata

    def _output_row_counts(self, shape: int) -> Iterable[int]:
        """Every batch size that pads to ``shape`` (0, an idle batch, pads to the smallest)."""
        return [size for size, bucket in enumerate(self.bucket_by_size) if bucket == shape]

    def _static_batch(self, bucket: int) -> ForwardBatch:
        """A batch of ``bucket`` rows viewing the static buffers: what a graph of that size was captured with."""
        view = self.inputs.view
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bucket,
            input_ids=view("input_ids", bucket),
            positions=view("positions", bucket),
            seq_lens=view("seq_lens", bucket),
            req_pool_indices=view("req_pool_indices", bucket),
            out_cache_loc=view("out_cache_loc", bucket),
            seq_lens_sum=bucket * self.inputs.seq_len_fill_value,
            seq_lens_cpu=self.inputs.seq_lens_cpu[:bucket],
        )

    def _prepare_capture(self, shape: int) -> Callable[[], torch.Tensor]:
        batch = self.static_buckets[shape].batch
        self.model_runner.attn_backend.init_forward_metadata_capture_cuda_graph(
            shape, shape, batch.req_pool_indices, batch.seq_lens, ForwardMode.DECODE
        )
        forward = self.model_runner.forward
        return lambda: forward(batch)

    def bucket_of(self, batch: ForwardBatch) -> int | None:
        """The bucket ``batch`` replays, or ``None`` when it must run eagerly."""
        if not self.captured or batch.forward_mode not in _GRAPHED_MODES or batch.batch_size > self.max_size:
            return None
        return self.bucket_by_size[batch.batch_size]

    def can_run(self, batch: ForwardBatch) -> bool:
        """Decode or idle, with a batch size some bucket holds (exactly, when padding is disabled)."""
        return self.bucket_of(batch) is not None

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits ``[batch_size, vocab]`` from the graph of the nearest bucket (eager when ``can_run`` is false).

        The returned tensor views the graph's static output: it is overwritten by the next replay.
        """
        bucket = self.bucket_of(batch)
        if bucket is None:
            return self.model_runner.forward(batch)
        batch_size = batch.batch_size
        inputs = self.inputs
        if batch.forward_mode is ForwardMode.DECODE:
            inputs.load(batch, batch_size, batch_size)
        else:
            inputs.pad_from(0, 0)  # idle: every row is padding
        static_bucket = self.static_buckets[bucket]
        static_batch = static_bucket.batch
        # The host mirror is current only when it is kept and the batch brought host lengths (idle: all padding).
        host_seq_lens = (
            static_batch.seq_lens_cpu
            if inputs.mirror_seq_lens_cpu and (batch.seq_lens_cpu is not None or batch_size == 0)
            else None
        )
        self._replay_attn_metadata(
            bucket,
            static_batch.req_pool_indices,
            static_batch.seq_lens,
            batch.seq_lens_sum + (bucket - batch_size) * inputs.seq_len_fill_value,
            ForwardMode.DECODE,
            seq_lens_cpu=host_seq_lens,
        )
        return self._replay_bucket(bucket, static_bucket, batch_size)
