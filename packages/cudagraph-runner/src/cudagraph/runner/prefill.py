"""Prefill graphs keyed by token count: extend batches padded up to the nearest captured token count.

A prefill graph has a fixed number of token rows (its bucket) and of request rows (``requests_per_graph``): padded
tokens write to the scratch KV slot, padded requests own no tokens. Attention depends on every request's extend
length. The breakable and tc_piecewise backends run it eagerly at replay, reading the real per-request lengths from
the batch in the forward context. The full backend captures it inside the graph: the attention backend's hooks get
``attention_in_graph=True`` and keep static index buffers per bucket, re-planned from the host lengths before every
replay; a batch with more requests than the bucket's rows, or more tokens than the largest bucket, runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import ClassVar

import torch

from cudagraph.backend_utils import ShapeDescriptor
from cudagraph.config import Phase

from .base import BaseCudaGraphRunner
from .forward_batch import PADDING_REQ_POOL_INDEX, ForwardBatch, ForwardMode
from .replay_metadata import ReplayMetadata
from .routing import EagerReason, Route
from .static_buffers import EXTEND_FIELDS, StaticBuffers
from .step_inputs import StepInputs

_EXTEND = ForwardMode.EXTEND
_TOO_MANY_REQUESTS = Route.eager(EagerReason.TOO_MANY_REQUESTS)


class PrefillCudaGraphRunner(BaseCudaGraphRunner):
    """Replays extend steps from graphs captured per token count (breakable by default, tc_piecewise if set)."""

    phase: ClassVar[Phase] = Phase.PREFILL

    @property
    def max_requests(self) -> int:
        """Request rows of the largest graph: the engine's request rows, less the scratch row, at most one per token."""
        table_rows = int(self.model_runner.req_to_token_pool.req_to_token.shape[0])
        return max(1, min(self.max_size, table_rows - 1 - PADDING_REQ_POOL_INDEX))

    @property
    def attention_in_graph(self) -> bool:
        """Whether attention runs inside the graph (full) rather than as an eager break (breakable, tc_piecewise)."""
        return bool(self.backend.captures_attn_metadata)

    def shape_descriptor(self, bucket: int) -> ShapeDescriptor:
        """The bucket the graph of ``bucket`` tokens serves: any mix of requests (prefill, chunked prefill, decodes
        mixed in), so no uniform query length."""
        return ShapeDescriptor.prefill(bucket)

    def requests_per_graph(self, bucket: int) -> int:
        """Request rows of the graph of ``bucket`` tokens."""
        return min(bucket, self.max_requests)

    def _allocate_static_buffers(self) -> None:
        attn_backend = self.model_runner.attn_backend
        self.static_buffers = StaticBuffers.allocate(
            EXTEND_FIELDS,
            max_tokens=self.max_size,
            max_requests=self.max_requests,
            device=self.device,
            seq_len_fill_value=attn_backend.get_cuda_graph_seq_len_fill_value(),
        )
        attn_backend.init_cuda_graph_state(self.max_requests, self.max_size)
        self._attention_in_graph = self.attention_in_graph
        self._index_buckets()

    def _output_row_counts(self, bucket: int) -> Iterable[int]:
        """Every request count the graph of ``bucket`` tokens has rows for."""
        return range(self.requests_per_graph(bucket) + 1)

    def _static_batch(self, bucket: int) -> ForwardBatch:
        """All-padding batch of ``bucket`` tokens viewing the static buffers: what the graph is captured with."""
        view = self.static_buffers.view
        requests = self.requests_per_graph(bucket)
        return ForwardBatch(
            forward_mode=ForwardMode.EXTEND,
            batch_size=0,
            input_ids=view("input_ids", bucket),
            positions=view("positions", bucket),
            seq_lens=view("seq_lens", requests),
            req_pool_indices=view("req_pool_indices", requests),
            out_cache_loc=view("out_cache_loc", bucket),
            seq_lens_sum=0,
            seq_lens_cpu=self.static_buffers.seq_lens_cpu[:0],
            extend_seq_lens=view("extend_seq_lens", requests),
            extend_prefix_lens=view("extend_prefix_lens", requests),
            extend_start_loc=view("extend_start_loc", requests),
            extend_num_tokens=0,
            extend_seq_lens_cpu=[],
            extend_prefix_lens_cpu=[],
        )

    def _prepare_capture(self, bucket: int) -> Callable[[], torch.Tensor]:
        batch = self.static_buckets[bucket].batch
        self.model_runner.attn_backend.init_forward_metadata_capture_cuda_graph(
            self.requests_per_graph(bucket),
            bucket,
            batch.req_pool_indices,
            batch.seq_lens,
            ForwardMode.EXTEND,
            forward_batch=batch,
            attention_in_graph=self.attention_in_graph,
        )
        forward = self.model_runner.forward
        return lambda: forward(batch)

    def _request_rows(self, bucket: int) -> int:
        return self.requests_per_graph(bucket)

    def route(self, batch: ForwardBatch) -> Route:
        """Extend mode, by token count: the bucket that holds it (see ``BaseCudaGraphRunner.route``), as long as the
        batch has no more requests than that graph has rows for."""
        if batch.forward_mode is not _EXTEND:
            return self.static_buckets.wrong_mode
        return self._route_of(int(batch.input_ids.shape[0]), batch.batch_size)

    def _route_of(self, num_tokens: int, batch_size: int) -> Route:
        """The route of an extend step of ``num_tokens`` tokens over ``batch_size`` requests (``route``'s rule)."""
        route = self.static_buckets.route_of_size(num_tokens)
        if batch_size > route.requests and route.bucket is not None:
            return _TOO_MANY_REQUESTS
        return route

    def input_views(self, num_tokens: int, batch_size: int) -> Mapping[str, torch.Tensor] | None:
        """Where to write an extend step of ``num_tokens`` tokens over ``batch_size`` requests so that its replay
        copies nothing: the first rows of the static buffers by ``ForwardBatch`` field name (``num_tokens`` rows per
        token, ``batch_size`` per request, the extend fields included) and ``"seq_lens_cpu"``, the same tensors every
        call; ``None`` when that step would not replay a graph (see ``DecodeCudaGraphRunner.input_views``)."""
        return self.step_inputs(num_tokens, batch_size).views

    def step_inputs(self, num_tokens: int, batch_size: int) -> StepInputs:
        """The route of an extend step of ``num_tokens`` tokens over ``batch_size`` requests (what ``route`` gives
        its batch), and its ``input_views``: one lookup, made before the batch is built (see
        ``DecodeCudaGraphRunner.step_inputs``)."""
        route = self._route_of(num_tokens, batch_size)
        if num_tokens < 1 or batch_size < 1 or route.bucket is None or route.bucket in self.static_buckets.pending:
            # eager, or captured on first use (over padding rows, so not in the views)
            return StepInputs(route, None)
        return StepInputs(route, self.static_buffers.views(num_tokens, batch_size))

    def replay(self, batch: ForwardBatch, route: Route | None = None) -> torch.Tensor:
        """Logits ``[batch_size, vocab]`` (each request's last token) from the graph of ``route``'s token bucket.

        Eager when the route has no bucket. The returned tensor views the graph's static output.
        """
        route = self._taken_route(batch, route)
        bucket = route.bucket
        if bucket is None:
            return self._run_eagerly(batch, route)
        num_tokens, batch_size = int(batch.input_ids.shape[0]), batch.batch_size
        self.metrics.count_replay(num_tokens)
        buffers = self.static_buffers
        buffers.copy_in(batch, num_tokens, batch_size)
        static_bucket = self.static_buckets[bucket]
        static_batch = static_bucket.batch
        # The captured forward and its eager breaks see this very batch object: its tensors stay the padded static
        # views, its host-side fields are updated in place to describe the real requests.
        static_batch.batch_size = batch_size
        static_batch.seq_lens_sum = batch.seq_lens_sum
        static_batch.seq_lens_cpu = buffers.seq_lens_cpu[:batch_size] if batch.seq_lens_cpu is not None else None
        static_batch.extend_num_tokens = num_tokens
        static_batch.extend_seq_lens_cpu = batch.extend_seq_lens_cpu
        static_batch.extend_prefix_lens_cpu = batch.extend_prefix_lens_cpu
        static_batch.attn_metadata = None
        self._replay_attn_metadata(
            ReplayMetadata(
                route.requests,
                static_batch.req_pool_indices,
                static_batch.seq_lens,
                batch.seq_lens_sum,
                _EXTEND,
                static_batch.seq_lens_cpu,
                static_batch,
                self._attention_in_graph,
            )
        )
        return self._replay_static(bucket, static_bucket, batch_size)
