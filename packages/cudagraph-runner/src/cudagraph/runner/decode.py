"""Uniform-step graphs keyed by batch size: decode (one token per request) or a speculative verify (``query_len``
tokens per request), padded up to the nearest captured batch size.

A uniform step is one whose requests all bring the same number of tokens, so its graph is keyed by the request
count alone: ``ShapeDescriptor.uniform(requests, query_len)``. A runner serves one query length: the engine keeps a
decode runner (``query_len=1``) and, with speculative decoding, a verify runner (``query_len = draft tokens + 1``),
both under the decode phase's backend and buckets (a bucket counts requests; its graph holds ``bucket * query_len``
token rows).

``get_batch_sizes_to_capture`` says which batch sizes a config captures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import ClassVar

import torch

from cudagraph.backend import BaseCudaGraphBackend
from cudagraph.backend_utils import ShapeDescriptor
from cudagraph.config import ConfigError, CudaGraphConfig, Phase, PhaseConfig

from .base import BaseCudaGraphRunner
from .forward_batch import ForwardBatch, ForwardMode
from .metrics import ReplayMetrics
from .protocols import ModelRunnerLike, needs_seq_lens_cpu
from .replay_metadata import ReplayMetadata
from .routing import EagerReason, Route
from .static_buffers import DECODE_FIELDS, PaddedField, StaticBuffers
from .step_inputs import StepInputs
from .switches import RunnerConfig

_DECODE = ForwardMode.DECODE
_IDLE = ForwardMode.IDLE
_WRONG_QUERY_LEN = Route.eager(EagerReason.QUERY_LEN_NOT_CAPTURED)


def get_batch_sizes_to_capture(config: CudaGraphConfig) -> list[int]:
    """The decode batch sizes ``config`` captures, ascending (empty when decode graphs are disabled)."""
    return list(config.decode.buckets) if config.decode.enabled else []


class DecodeCudaGraphRunner(BaseCudaGraphRunner):
    """Replays uniform steps from graphs captured per batch size: decode (and idle) steps, or with ``query_len``
    above 1 the verify steps of speculative decoding (``ForwardMode.TARGET_VERIFY``, ``query_len`` tokens a request).

    A step: routed once by batch size (``route``), copied into the static buffers (one fused copy per dtype,
    padding re-applied only when the batch shrank), the attention backend refreshes its static metadata, the padded
    bucket replays, and the logits view of the real batch made at capture comes back (decode: a row per request;
    verify: a row per token). Batches routed eagerly run through ``model_runner.forward``. A verify step with another
    number of tokens per request runs eagerly (``EagerReason.QUERY_LEN_NOT_CAPTURED``).
    """

    phase: ClassVar[Phase] = Phase.DECODE
    static_fields: ClassVar[tuple[PaddedField, ...]] = DECODE_FIELDS
    """The ``ForwardBatch`` fields its static buffers hold (a subclass may add its own)."""

    def __init__(
        self,
        model_runner: ModelRunnerLike,
        config: CudaGraphConfig | PhaseConfig | RunnerConfig,
        *,
        backend: BaseCudaGraphBackend | None = None,
        show_progress: bool = True,
        num_warmups: int | None = None,
        capture_barrier: Callable[[], None] | None = None,
        metrics: ReplayMetrics | None = None,
        query_len: int = 1,
    ) -> None:
        if isinstance(query_len, bool) or not isinstance(query_len, int) or query_len < 1:
            raise ConfigError(
                f"query_len must be a whole number of tokens per request, at least 1 (1: decode; draft tokens + 1: "
                f"speculative verify); got {query_len!r}"
            )
        self.query_len: int = query_len
        """Tokens every request brings to a step this runner graphs (1: decode)."""
        self.forward_mode: ForwardMode = _DECODE if query_len == 1 else ForwardMode.TARGET_VERIFY
        """The forward mode its graphs are captured in (decode, or target verify)."""
        self._graphed_modes = frozenset({self.forward_mode, _IDLE})
        super().__init__(
            model_runner,
            config,
            backend=backend,
            show_progress=show_progress,
            num_warmups=num_warmups,
            capture_barrier=capture_barrier,
            metrics=metrics,
        )

    def _tokens_per_size(self) -> int:
        return self.query_len

    def shape_descriptor(self, bucket: int) -> ShapeDescriptor:
        """The bucket the graph of ``bucket`` requests serves."""
        return ShapeDescriptor.uniform(bucket, self.query_len)

    def _allocate_static_buffers(self) -> None:
        attn_backend = self.model_runner.attn_backend
        max_tokens = self.max_size * self.query_len
        self.static_buffers = StaticBuffers.allocate(
            self.static_fields,
            max_tokens=max_tokens,
            max_requests=self.max_size,
            device=self.device,
            seq_len_fill_value=attn_backend.get_cuda_graph_seq_len_fill_value(),
        )
        self.static_buffers.mirror_seq_lens_cpu = needs_seq_lens_cpu(attn_backend)
        attn_backend.init_cuda_graph_state(self.max_size, max_tokens)
        self._index_buckets()

    def _replay_reads_no_context(self) -> bool:
        return self.backend.captures_attn_metadata

    def _output_row_counts(self, bucket: int) -> Iterable[int]:
        """The output rows of every batch size that pads to ``bucket`` (0, an idle batch, pads to the smallest): a
        row per request in decode, a row per token in verify."""
        return [size * self.query_len for size in range(bucket + 1) if self.pad_to_bucket(max(size, 1)) == bucket]

    def _static_batch(self, bucket: int) -> ForwardBatch:
        """A batch of ``bucket`` requests viewing the static buffers: what a graph of that size was captured with."""
        view = self.static_buffers.view
        tokens = bucket * self.query_len
        return ForwardBatch(
            forward_mode=self.forward_mode,
            batch_size=bucket,
            input_ids=view("input_ids", tokens),
            positions=view("positions", tokens),
            seq_lens=view("seq_lens", bucket),
            req_pool_indices=view("req_pool_indices", bucket),
            out_cache_loc=view("out_cache_loc", tokens),
            seq_lens_sum=bucket * self.static_buffers.seq_len_fill_value,
            seq_lens_cpu=self.static_buffers.seq_lens_cpu[:bucket],
        )

    def _prepare_capture(self, bucket: int) -> Callable[[], torch.Tensor]:
        batch = self.static_buckets[bucket].batch
        self.model_runner.attn_backend.init_forward_metadata_capture_cuda_graph(
            bucket, bucket * self.query_len, batch.req_pool_indices, batch.seq_lens, self.forward_mode
        )
        forward = self.model_runner.forward
        return lambda: forward(batch)

    def route(self, batch: ForwardBatch) -> Route:
        """A step of this runner's mode (or idle), by batch size: the bucket that holds it (exactly, when padding is
        disabled) unless it has no graph or pads over ``max_padding_ratio``; larger batches and other modes run
        eagerly, and so does a verify step whose tokens per request differ from ``query_len``."""
        buckets = self.static_buckets
        if batch.forward_mode not in self._graphed_modes:
            return buckets.wrong_mode
        size = batch.batch_size
        if self.query_len != 1 and batch.forward_mode is not _IDLE and batch.num_tokens != size * self.query_len:
            return _WRONG_QUERY_LEN
        routes = buckets.by_size
        return routes[size] if size < len(routes) else buckets.beyond

    def input_views(self, batch_size: int) -> Mapping[str, torch.Tensor] | None:
        """Where to write a step of ``batch_size`` requests so that its replay copies nothing: the first rows of the
        static buffers by ``ForwardBatch`` field name (``batch_size * query_len`` rows per token, ``batch_size`` per
        request) and ``"seq_lens_cpu"``, the same tensors every call; ``None`` when that size would not replay a
        graph (it runs eagerly: build its batch as usual).

        Example (an engine's decode step; ``host`` holds its fields as CPU tensors, ``seq_lens_cpu`` included)::

            views = runner.input_views(batch_size)
            if views is None:  # eager: the batch's own tensors
                fields = {name: tensor.to(device) for name, tensor in host.items()}
                fields["seq_lens_cpu"] = host["seq_lens_cpu"]
            else:  # written in place: the replay copies nothing
                fields = views
                for name, tensor in host.items():
                    views[name].copy_(tensor, non_blocking=True)
            batch = ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=batch_size, seq_lens_sum=total, **fields)
            logits = runner.replay(batch)
        """
        return self.step_inputs(batch_size).views

    def step_inputs(self, batch_size: int) -> StepInputs:
        """The route of a step of ``batch_size`` requests in this runner's mode (what ``route`` gives its batch), and
        its ``input_views``: one lookup, made before the batch is built; build the batch with ``route`` set to it
        and ``replay`` takes it as given (``cudagraph.runner.step_inputs``)."""
        buckets = self.static_buckets
        route = buckets.route_of_size(batch_size)
        if batch_size < 1 or route.bucket is None or route.bucket in buckets.pending:
            # eager, or captured on first use (over padding rows, so not in the views)
            return StepInputs(route, None)
        return StepInputs(route, self.static_buffers.views(batch_size * self.query_len, batch_size))

    def bucket_of(self, batch: ForwardBatch) -> int | None:
        """The bucket ``batch`` replays, or ``None`` when it must run eagerly."""
        return self.route(batch).bucket

    def replay(self, batch: ForwardBatch, route: Route | None = None) -> torch.Tensor:
        """Logits from the graph of ``route``'s bucket (eager when it has none): ``[batch_size, vocab]`` in decode,
        ``[batch_size * query_len, vocab]`` in verify.

        The returned tensor views the graph's static output: it is overwritten by the next replay.
        """
        route = self._taken_route(batch, route)
        bucket = route.bucket
        if bucket is None:
            return self._run_eagerly(batch, route)
        batch_size = batch.batch_size
        self.metrics.count_replay(batch_size)
        buffers = self.static_buffers
        mode = self.forward_mode
        if batch.forward_mode is mode:
            buffers.copy_in(batch, batch_size * self.query_len, batch_size)
        else:
            buffers.pad_from(0, 0)  # idle: every row is padding
        static_bucket = self.static_buckets[bucket]
        static_batch = static_bucket.batch
        # The host mirror is current only when it is kept and the batch brought host lengths (idle: all padding).
        host_seq_lens = (
            static_batch.seq_lens_cpu
            if buffers.mirror_seq_lens_cpu and (batch.seq_lens_cpu is not None or batch_size == 0)
            else None
        )
        self._replay_attn_metadata(
            ReplayMetadata(
                bucket,
                static_batch.req_pool_indices,
                static_batch.seq_lens,
                batch.seq_lens_sum + (bucket - batch_size) * buffers.seq_len_fill_value,
                mode,
                host_seq_lens,
                query_len=self.query_len,
            )
        )
        return self._replay_static(bucket, static_bucket, batch_size * self.query_len)
