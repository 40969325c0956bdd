"""Decode graphs keyed by batch size: one token per request, padded up to the nearest captured batch size; the
batch sizes a config captures (``get_batch_sizes_to_capture``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar

import torch

from cudagraph.config import CudaGraphConfig, Phase

from .base import BaseCudaGraphRunner
from .forward_batch import ForwardBatch, ForwardMode
from .replay_metadata import ReplayMetadata
from .routing import Route
from .static_buffers import DECODE_FIELDS, StaticInputs

_DECODE = ForwardMode.DECODE
_GRAPHED_MODES = frozenset({ForwardMode.DECODE, ForwardMode.IDLE})


def get_batch_sizes_to_capture(config: CudaGraphConfig) -> list[int]:
    """The decode batch sizes ``config`` captures, ascending (empty when decode graphs are disabled)."""
    return list(config.decode.buckets) if config.decode.enabled else []


class DecodeCudaGraphRunner(BaseCudaGraphRunner):
    """Replays decode (and idle) steps from graphs captured per batch size.

    A step: routed once by batch size (``route``), copied into the static buffers (one fused copy per dtype,
    padding re-applied only when the batch shrank), the attention backend refreshes its static metadata, the padded
    bucket replays, and the logits view of the real batch made at capture comes back. Batches routed eagerly run
    through ``model_runner.forward``.
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

    def route(self, batch: ForwardBatch) -> Route:
        """Decode or idle, by batch size: the bucket that holds it (exactly, when padding is disabled) unless it has
        no graph or pads over ``max_padding_ratio``; larger batches and other modes run eagerly."""
        if batch.forward_mode not in _GRAPHED_MODES:
            return self._route_wrong_mode
        size = batch.batch_size
        routes = self._routes_by_size
        return routes[size] if size < len(routes) else self._route_beyond

    def bucket_of(self, batch: ForwardBatch) -> int | None:
        """The bucket ``batch`` replays, or ``None`` when it must run eagerly."""
        return self.route(batch).bucket

    def replay_routed(self, batch: ForwardBatch, route: Route) -> torch.Tensor:
        """Logits ``[batch_size, vocab]`` from the graph of ``route``'s bucket (eager when it has none).

        The returned tensor views the graph's static output: it is overwritten by the next replay.
        """
        bucket = route.bucket
        if bucket is None:
            return self._run_eagerly(batch, route)
        batch_size = batch.batch_size
        self.metrics.count_replay(batch_size)
        inputs = self.inputs
        if batch.forward_mode is _DECODE:
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
            ReplayMetadata(
                bucket,
                static_batch.req_pool_indices,
                static_batch.seq_lens,
                batch.seq_lens_sum + (bucket - batch_size) * inputs.seq_len_fill_value,
                _DECODE,
                host_seq_lens,
            )
        )
        return self._replay_bucket(bucket, static_bucket, batch_size)
