"""The draft extend after a verify step: the draft model catches up over the tokens the target accepted, in one graph
per batch size, and hands each request's next draft token and hidden state on, chosen on the device.

After a verify step of ``k`` drafts, request ``r`` accepted ``a_r`` of them and got the target's own next token:
``a_r + 1`` new tokens, each with the target's hidden state of the token before it. The draft extend step feeds
them to the draft model (``k + 1`` rows a request, the rows past ``a_r + 1`` padding whose KV writes the next draft
steps overwrite) and returns, per request, the draft model's token choice and hidden state at its last real row:
what the draft runner (``cudagraph.runner.draft``) chains its steps from. The last real row is found on the device
from ``ForwardBatch.accepted_lens``, so the replay never waits for the host.

The step is verify-shaped (``ForwardMode.TARGET_VERIFY``: ``query_len`` tokens a request, each seeing the cache up
to itself), so any attention backend that runs verify steps runs it. Buckets, backend and graph pool are the decode
phase's (a bucket counts requests).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import ClassVar, NamedTuple

import torch

from cudagraph.backend import BaseCudaGraphBackend
from cudagraph.config import CudaGraphConfig, PhaseConfig

from .decode import DecodeCudaGraphRunner
from .draft import DraftStepTracing, check_whole_count
from .forward_batch import ForwardBatch
from .metrics import ReplayMetrics
from .protocols import DraftModelRunnerLike
from .replay_metadata import ReplayMetadata
from .routing import Route
from .static_buffers import DECODE_FIELDS, PaddedField
from .switches import RunnerConfig

DRAFT_EXTEND_FIELDS = (*DECODE_FIELDS, PaddedField("accepted_lens", torch.int64, per_token=False, padding=1))
"""A draft extend's static buffers: decode's, per token, and each request's real rows (padded requests: one)."""


class DraftSeed(NamedTuple):
    """What a draft extend hands to the draft steps, one row per request: the draft model's token choice and hidden
    state at the request's last real row."""

    tokens: torch.Tensor
    """[B] int64."""
    hidden_states: torch.Tensor
    """[B, H]."""


def last_real_rows(accepted_lens: torch.Tensor, query_len: int) -> torch.Tensor:
    """The flat row index of each request's last real row (``r * query_len + accepted_lens[r] - 1``), on the
    device.

    Example:
        >>> last_real_rows(torch.tensor([1, 3, 2]), 3).tolist()
        [0, 5, 7]
    """
    starts = torch.arange(accepted_lens.shape[0], device=accepted_lens.device) * query_len
    return starts + accepted_lens - 1


def seed_of(logits: torch.Tensor, hidden: torch.Tensor, accepted_lens: torch.Tensor, query_len: int) -> DraftSeed:
    """The ``DraftSeed`` of a draft extend's every-row ``logits`` and ``hidden`` states: each request's last real
    row, its token chosen by argmax (no host sync)."""
    rows = last_real_rows(accepted_lens, query_len)
    return DraftSeed(logits.index_select(0, rows).argmax(dim=-1), hidden.index_select(0, rows))


class DraftExtendCudaGraphRunner(DraftStepTracing, DecodeCudaGraphRunner):
    """Replays draft extend steps (``query_len`` rows a request: the accepted drafts and the target's token, padded)
    from graphs captured per batch size (see the module docstring).

    ``replay(batch)`` takes a verify-shaped batch with ``hidden_states`` ``[B * query_len, H]`` and
    ``accepted_lens`` ``[B]`` and returns a ``DraftSeed`` (views of the graph's static output). Batches with no
    graph run the same step eagerly (``extend_eagerly``), counted under their reason.
    """

    static_fields: ClassVar[tuple[PaddedField, ...]] = DRAFT_EXTEND_FIELDS

    def __init__(
        self,
        model_runner: DraftModelRunnerLike,
        config: CudaGraphConfig | PhaseConfig | RunnerConfig,
        *,
        query_len: int,
        backend: BaseCudaGraphBackend | None = None,
        show_progress: bool = True,
        num_warmups: int | None = None,
        capture_barrier: Callable[[], None] | None = None,
        metrics: ReplayMetrics | None = None,
    ) -> None:
        check_whole_count("query_len", query_len, 1, "rows a request: the drafts a verify step checked, plus one")
        self.hidden_size: int = model_runner.hidden_size
        self.draft_model_runner: DraftModelRunnerLike = model_runner
        super().__init__(
            model_runner,
            config,
            backend=backend,
            show_progress=show_progress,
            num_warmups=num_warmups,
            capture_barrier=capture_barrier,
            metrics=metrics,
            query_len=query_len,
        )
        self._graphed_modes = frozenset({self.forward_mode})  # no idle steps: a draft extend always has rows

    def _allocate_static_buffers(self) -> None:
        size, dtype = self.max_size, self.model_runner.dtype
        self.hidden_states = torch.zeros((size * self.query_len, self.hidden_size), dtype=dtype, device=self.device)
        """The hidden states handed to every row (static: what every graph reads)."""
        self.seed_tokens = torch.zeros(size, dtype=torch.int64, device=self.device)
        self.seed_hidden_states = torch.zeros((size, self.hidden_size), dtype=dtype, device=self.device)
        super()._allocate_static_buffers()

    def static_buffer_tensors(self, bucket: int) -> list[torch.Tensor]:
        """Every static buffer the graph of ``bucket`` reads (debug mode checks their addresses)."""
        return [*self.static_buffers.tensors.values(), self.hidden_states]

    def shutdown(self) -> None:
        """Free graphs and every static buffer (the hidden states and the seed too)."""
        super().shutdown()
        self.hidden_states = self.seed_tokens = self.seed_hidden_states = torch.empty(0, device=self.device)

    def _output_row_counts(self, bucket: int) -> Iterable[int]:
        return [size for size in range(1, bucket + 1) if self.pad_to_bucket(size) == bucket]

    def _static_batch(self, bucket: int) -> ForwardBatch:
        return dataclasses.replace(
            super()._static_batch(bucket),
            hidden_states=self.hidden_states[: bucket * self.query_len],
            accepted_lens=self.static_buffers.view("accepted_lens", bucket),
        )

    def _prepare_capture(self, bucket: int) -> Callable[[], torch.Tensor]:
        batch = self.static_buckets[bucket].batch
        self.model_runner.attn_backend.init_forward_metadata_capture_cuda_graph(
            bucket, bucket * self.query_len, batch.req_pool_indices, batch.seq_lens, self.forward_mode
        )
        tokens, hidden = self.seed_tokens[:bucket], self.seed_hidden_states[:bucket]

        def extend_into_seed() -> torch.Tensor:
            seed = self._extend(batch)
            tokens.copy_(seed.tokens)
            hidden.copy_(seed.hidden_states)
            return hidden

        return extend_into_seed

    def _extend(self, batch: ForwardBatch) -> DraftSeed:
        assert batch.accepted_lens is not None
        logits, hidden = self.draft_model_runner.draft_forward(batch, self.model_runner.attn_backend)
        # The batch's own rows a request (an eager step may bring another number than the graphs hold).
        return seed_of(logits, hidden, batch.accepted_lens, batch.num_tokens // max(batch.batch_size, 1))

    def extend_eagerly(self, batch: ForwardBatch) -> DraftSeed:
        """The ``DraftSeed`` of ``batch`` with no graph (the same step, run eagerly)."""
        self._check_draft_inputs(batch)
        return self._extend(batch)

    def _forward_eagerly(self, batch: ForwardBatch) -> DraftSeed:  # type: ignore[override]
        return self.extend_eagerly(batch)

    @staticmethod
    def _check_draft_inputs(batch: ForwardBatch) -> None:
        missing = [name for name in ("hidden_states", "accepted_lens") if getattr(batch, name) is None]
        if missing:
            raise ValueError(f"a draft extend step reads {' and '.join(missing)}; the batch has none")

    # -- route and replay ---------------------------------------------------------------------------------------------

    def input_views(self, batch_size: int) -> Mapping[str, torch.Tensor] | None:
        """Where a draft extend of ``batch_size`` requests can be written so its replay copies nothing (the decode
        runner's views, ``"accepted_lens"`` and ``"hidden_states"`` among them); ``None`` when it would run eagerly."""
        views = super().input_views(batch_size)
        if views is None:
            return None
        return {**views, "hidden_states": self.hidden_states[: batch_size * self.query_len]}

    def replay(self, batch: ForwardBatch, route: Route | None = None) -> DraftSeed:  # type: ignore[override]
        """Each request's ``DraftSeed`` from the graph of ``route``'s bucket (eager when it has none). The result
        views the graph's static output: the next replay overwrites it."""
        route = self._taken_route(batch, route)
        bucket = route.bucket
        if bucket is None:
            return self._run_eagerly(batch, route)  # type: ignore[return-value]  # the eager step gives a DraftSeed
        self._check_draft_inputs(batch)
        assert batch.hidden_states is not None
        size, tokens = batch.batch_size, batch.batch_size * self.query_len
        self.metrics.count_replay(size)
        buffers = self.static_buffers
        buffers.copy_in(batch, tokens, size)
        if batch.hidden_states is not self.hidden_states[:tokens]:
            self.hidden_states[:tokens].copy_(batch.hidden_states)
        static_bucket = self.static_buckets[bucket]
        static = static_bucket.batch
        host_lengths = buffers.mirror_seq_lens_cpu and batch.seq_lens_cpu is not None
        self._replay_attn_metadata(
            ReplayMetadata(
                bucket,
                static.req_pool_indices,
                static.seq_lens,
                batch.seq_lens_sum + (bucket - size) * buffers.seq_len_fill_value,
                self.forward_mode,
                static.seq_lens_cpu if host_lengths else None,
                query_len=self.query_len,
            )
        )
        hidden = self._replay_static(bucket, static_bucket, size)
        return DraftSeed(self.seed_tokens[:size], hidden)
