"""Draft steps of speculative decoding, chained on the device: ``num_steps`` forwards of a draft model (an
EAGLE-style head) in one graph per bucket, each step's token chosen and handed to the next with no host in between.

A draft step reads a token and a hidden state per request and gives the next token (argmax) and the next hidden
state. The runner captures, per batch size, the whole chain::

    step 0: the batch as given (its token, position, KV slot, seq_len, hidden state)
    step i: token = argmax of step i-1, hidden = step i-1's, position + i, seq_len + i,
            KV slot = req_to_token[request row, position + i] (slots the engine reserved ahead)

and returns the chosen tokens ``[batch_size, num_steps]``. What runs outside the graph before each replay is what
the attention backends plan on: each step's ``seq_lens`` (one add for all steps) and, per step, the backend's replay
hook (``step_attn_backends[i]``: each step attends over one more token). Positions, KV slots and tokens of the later
steps are computed inside the graph.

Buckets, backend and graph pool are the decode phase's (a bucket counts requests); on ``breakable`` and
``tc_piecewise`` the draft model's attention breaks must bind their step's metadata at capture (the reference
engine's backends do), since one replay serves every step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import torch

from cudagraph.backend import BaseCudaGraphBackend
from cudagraph.config import ConfigError, CudaGraphConfig, PhaseConfig

from .decode import DecodeCudaGraphRunner
from .forward_batch import ForwardBatch, ForwardMode
from .metrics import ReplayMetrics
from .protocols import (
    AttentionBackendLike,
    DraftModelRunnerLike,
    ModelRunnerLike,
    TraceableDraftModelRunner,
    needs_seq_lens_cpu,
)
from .replay_metadata import ReplayHook, ReplayMetadata, bind_replay_hook
from .routing import Route
from .static_buffers import DECODE_FIELDS, StaticBuffers
from .switches import RunnerConfig

_DECODE = ForwardMode.DECODE


def check_whole_count(name: str, value: object, least: int, meaning: str) -> int:
    """``value`` when it is a whole number of at least ``least``; else one ``ConfigError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{name} must be a whole number, at least {least} ({meaning}); got {value!r}")
    return value


@dataclasses.dataclass
class DraftStepBuffers:
    """The static buffers of draft steps 1 .. ``num_steps - 1`` (step 0 reads the runner's ``StaticBuffers``):
    one row per step, ``max_requests`` columns."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens: torch.Tensor
    """[num_steps, max_requests] int32: row ``i`` is step ``i``'s lengths (row 0 unused: step 0 reads the
    ``StaticBuffers``); written before each replay, read by the attention hooks and the graph."""
    seq_lens_cpu: torch.Tensor
    """The host copy of ``seq_lens`` (kept only when a step's backend plans on the host)."""
    offsets: torch.Tensor
    """[num_steps, 1] int32 ``0 .. num_steps - 1``: what each step adds to the lengths."""
    offsets_cpu: torch.Tensor
    """``offsets`` on the host (for the host lengths, with no copy from the device)."""

    @classmethod
    def allocate(cls, num_steps: int, max_requests: int, device: torch.device) -> DraftStepBuffers:
        """Buffers for ``num_steps`` steps of up to ``max_requests`` requests (padded rows: token 0, scratch slot)."""
        later = max(num_steps - 1, 0)
        return cls(
            input_ids=torch.zeros((later, max_requests), dtype=torch.int64, device=device),
            positions=torch.zeros((later, max_requests), dtype=torch.int64, device=device),
            out_cache_loc=torch.zeros((later, max_requests), dtype=torch.int64, device=device),
            seq_lens=torch.zeros((num_steps, max_requests), dtype=torch.int32, device=device),
            seq_lens_cpu=torch.zeros((num_steps, max_requests), dtype=torch.int32),
            offsets=torch.arange(num_steps, dtype=torch.int32, device=device)[:, None],
            offsets_cpu=torch.arange(num_steps, dtype=torch.int32)[:, None],
        )

    def tensors(self) -> list[torch.Tensor]:
        """Every buffer a graph reads."""
        return [self.input_ids, self.positions, self.out_cache_loc, self.seq_lens]


def next_step_batch(
    batch: ForwardBatch, step: int, req_to_token: torch.Tensor, out: DraftStepBuffers | None = None
) -> ForwardBatch:
    """Draft step ``step``'s batch after step 0's ``batch``: positions and lengths ``step`` further on, KV slots read
    from ``req_to_token`` at those positions. ``out``: write into step ``step``'s static rows (a capture); else new
    tensors (an eager step). Its tokens and hidden states are the previous step's (set by the caller)."""
    size = batch.batch_size
    if out is None:
        positions = batch.positions + step
        seq_lens = batch.seq_lens + step
        input_ids = torch.empty_like(batch.input_ids)
        host_seq_lens = batch.seq_lens_cpu + step if batch.seq_lens_cpu is not None else None
    else:
        positions = torch.add(batch.positions, step, out=out.positions[step - 1, :size])
        seq_lens = out.seq_lens[step, :size]
        input_ids = out.input_ids[step - 1, :size]
        host_seq_lens = out.seq_lens_cpu[step, :size]
    columns = positions.clamp(max=req_to_token.shape[1] - 1)
    slots = req_to_token[batch.req_pool_indices, columns]
    out_cache_loc = slots.long() if out is None else out.out_cache_loc[step - 1, :size].copy_(slots)
    return dataclasses.replace(
        batch,
        input_ids=input_ids,
        positions=positions,
        seq_lens=seq_lens,
        out_cache_loc=out_cache_loc,
        seq_lens_sum=batch.seq_lens_sum + step * size,
        seq_lens_cpu=host_seq_lens,
        route=None,
    )


class DraftStepTracing:
    """What a compiling backend traces of a draft runner's step, shared by both draft runners: the draft model
    runner's ``draft_model_forward`` (``TraceableDraftModelRunner``), called with the tokens, their positions and the
    hidden states handed to them."""

    model_runner: ModelRunnerLike

    def _traced_forward(self) -> Callable[..., torch.Tensor] | None:
        model_runner = self.model_runner
        return model_runner.draft_model_forward if isinstance(model_runner, TraceableDraftModelRunner) else None

    @staticmethod
    def _traced_inputs(batch: ForwardBatch) -> tuple[torch.Tensor, ...]:
        assert batch.hidden_states is not None
        return (batch.input_ids, batch.positions, batch.hidden_states)


class DraftCudaGraphRunner(DraftStepTracing, DecodeCudaGraphRunner):
    """Replays ``num_steps`` chained draft steps from one graph per batch size (see the module docstring).

    ``replay(batch)`` takes a decode-shaped batch (one token per request, ``hidden_states`` ``[B, H]``) and returns
    the drafted tokens ``[B, num_steps]`` (int64, on the device; a view of the graph's static output). Batches with
    no graph run the same chain eagerly (``draft_eagerly``), counted under their reason.

    Example (an engine's draft after its draft extend gave each request a token and a hidden state)::

        runner = DraftCudaGraphRunner(draft_model_runner, config, num_steps=k - 1)
        runner.capture()
        drafts = runner.replay(batch)  # [B, k - 1]
    """

    def __init__(
        self,
        model_runner: DraftModelRunnerLike,
        config: CudaGraphConfig | PhaseConfig | RunnerConfig,
        *,
        num_steps: int,
        backend: BaseCudaGraphBackend | None = None,
        show_progress: bool = True,
        num_warmups: int | None = None,
        capture_barrier: Callable[[], None] | None = None,
        metrics: ReplayMetrics | None = None,
    ) -> None:
        self.num_steps: int = check_whole_count("num_steps", num_steps, 1, "draft forwards chained in one graph")
        """Draft forwards each replay runs (each one token more per request)."""
        step_backends = tuple(model_runner.step_attn_backends)
        if len(step_backends) < num_steps:
            raise ConfigError(
                f"num_steps={num_steps} needs an attention backend per step; the draft model runner has "
                f"{len(step_backends)} (step_attn_backends)"
            )
        self.step_attn_backends: tuple[AttentionBackendLike, ...] = step_backends[:num_steps]
        self._step_hooks: tuple[ReplayHook, ...] = tuple(bind_replay_hook(b) for b in self.step_attn_backends)
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
        )
        self._graphed_modes = frozenset({_DECODE})  # no idle steps: a draft always has rows

    # -- static buffers and capture ---------------------------------------------------------------------------------

    def _allocate_static_buffers(self) -> None:
        first = self.step_attn_backends[0]
        size = self.max_size
        self.static_buffers = StaticBuffers.allocate(
            DECODE_FIELDS,
            max_tokens=size,
            max_requests=size,
            device=self.device,
            seq_len_fill_value=first.get_cuda_graph_seq_len_fill_value(),
        )
        self.static_buffers.mirror_seq_lens_cpu = any(needs_seq_lens_cpu(b) for b in self.step_attn_backends)
        self.hidden_states = torch.zeros((size, self.hidden_size), dtype=self.model_runner.dtype, device=self.device)
        """Step 0's hidden states (static: what every graph reads)."""
        self.step_buffers = DraftStepBuffers.allocate(self.num_steps, size, self.device)
        self.draft_tokens = torch.zeros((size, self.num_steps), dtype=torch.int64, device=self.device)
        """The static output: step ``i``'s chosen token of request ``r`` at ``[r, i]``."""
        for attn_backend in self.step_attn_backends:
            attn_backend.init_cuda_graph_state(size, size)
        self._index_buckets()

    def static_buffer_tensors(self, bucket: int) -> list[torch.Tensor]:
        """Every static buffer the graph of ``bucket`` reads (debug mode checks their addresses)."""
        return [*self.static_buffers.tensors.values(), self.hidden_states, *self.step_buffers.tensors()]

    def shutdown(self) -> None:
        """Free graphs and every static buffer (the step buffers and the hidden states too)."""
        super().shutdown()
        self.hidden_states = self.draft_tokens = torch.empty(0, device=self.device)

    def _static_batch(self, bucket: int) -> ForwardBatch:
        return dataclasses.replace(super()._static_batch(bucket), hidden_states=self.hidden_states[:bucket])

    def _prepare_capture(self, bucket: int) -> Callable[[], torch.Tensor]:
        static = self.static_buckets[bucket].batch
        self._write_step_lengths(bucket)
        steps = self._step_batches(static, self.step_buffers)
        for attn_backend, step in zip(self.step_attn_backends, steps, strict=True):
            attn_backend.init_forward_metadata_capture_cuda_graph(
                bucket, bucket, step.req_pool_indices, step.seq_lens, _DECODE
            )
        tokens = self.draft_tokens[:bucket]
        return lambda: self._chain(static, tokens, self.step_buffers)

    def _step_batches(self, static: ForwardBatch, buffers: DraftStepBuffers) -> list[ForwardBatch]:
        """Step batches viewing the static rows (their positions and slots are recomputed by the chain)."""
        size = static.batch_size
        steps = [static]
        for step in range(1, self.num_steps):
            steps.append(
                dataclasses.replace(
                    static,
                    input_ids=buffers.input_ids[step - 1, :size],
                    positions=buffers.positions[step - 1, :size],
                    seq_lens=buffers.seq_lens[step, :size],
                    out_cache_loc=buffers.out_cache_loc[step - 1, :size],
                    seq_lens_cpu=buffers.seq_lens_cpu[step, :size],
                )
            )
        return steps

    def _chain(self, batch: ForwardBatch, tokens: torch.Tensor, buffers: DraftStepBuffers | None) -> torch.Tensor:
        """Run the ``num_steps`` draft forwards from ``batch`` (step 0), writing step ``i``'s tokens to
        ``tokens[:, i]``: into the static step rows when ``buffers`` (what a graph captures), else into new tensors
        (the eager chain). No host sync either way."""
        forward = self.draft_model_runner.draft_forward
        req_to_token = self.model_runner.req_to_token_pool.req_to_token
        step_batch, hidden, token = batch, batch.hidden_states, None
        for step, attn_backend in enumerate(self.step_attn_backends):
            if token is not None:
                step_batch = next_step_batch(batch, step, req_to_token, buffers)
                step_batch.input_ids.copy_(token)
                step_batch.hidden_states = hidden
            logits, hidden = forward(step_batch, attn_backend)
            token = logits.argmax(dim=-1)
            tokens[:, step].copy_(token)
        return tokens

    # -- route and replay ---------------------------------------------------------------------------------------------

    def input_views(self, batch_size: int) -> Mapping[str, torch.Tensor] | None:
        """Where a draft step of ``batch_size`` requests can be written so its replay copies nothing (the decode
        runner's views, ``"hidden_states"`` among them); ``None`` when it would run eagerly."""
        views = super().input_views(batch_size)
        return None if views is None else {**views, "hidden_states": self.hidden_states[:batch_size]}

    def draft_eagerly(self, batch: ForwardBatch) -> torch.Tensor:
        """The drafted tokens ``[B, num_steps]`` of ``batch`` with no graph: the same chain, forward by forward."""
        if batch.hidden_states is None:
            raise ValueError("a draft step reads the hidden states handed to it: batch.hidden_states is None")
        tokens = torch.empty((batch.batch_size, self.num_steps), dtype=torch.int64, device=batch.input_ids.device)
        return self._chain(batch, tokens, None)

    def _forward_eagerly(self, batch: ForwardBatch) -> torch.Tensor:
        return self.draft_eagerly(batch)

    def _write_step_lengths(self, bucket: int) -> None:
        """Each step's ``seq_lens`` (step 0's plus the step), on the device and, when a backend plans on the host,
        on the host: one add each for every step."""
        buffers = self.step_buffers
        torch.add(
            self.static_buffers.view("seq_lens", bucket)[None, :], buffers.offsets, out=buffers.seq_lens[:, :bucket]
        )
        if self.static_buffers.mirror_seq_lens_cpu:
            host = self.static_buffers.seq_lens_cpu[:bucket]
            torch.add(host[None, :], buffers.offsets_cpu, out=buffers.seq_lens_cpu[:, :bucket])

    def replay(self, batch: ForwardBatch, route: Route | None = None) -> torch.Tensor:
        """The drafted tokens ``[batch_size, num_steps]`` from the graph of ``route``'s bucket (eager when it has
        none). The result views the graph's static output: the next replay overwrites it."""
        route = self._taken_route(batch, route)
        bucket = route.bucket
        if bucket is None:
            return self._run_eagerly(batch, route)
        if batch.hidden_states is None:
            raise ValueError("a draft step reads the hidden states handed to it: batch.hidden_states is None")
        size = batch.batch_size
        self.metrics.count_replay(size)
        buffers = self.static_buffers
        buffers.copy_in(batch, size, size)
        if batch.hidden_states is not self.hidden_states[:size]:
            self.hidden_states[:size].copy_(batch.hidden_states)
        self._write_step_lengths(bucket)
        static_bucket = self.static_buckets[bucket]
        static = static_bucket.batch
        host_lengths = buffers.mirror_seq_lens_cpu and batch.seq_lens_cpu is not None
        padding = (bucket - size) * buffers.seq_len_fill_value
        step_buffers = self.step_buffers
        for step, hook in enumerate(self._step_hooks):
            hook(
                ReplayMetadata(
                    bucket,
                    static.req_pool_indices,
                    step_buffers.seq_lens[step, :bucket] if step else static.seq_lens,
                    batch.seq_lens_sum + padding + step * bucket,  # every row, padded ones too, one longer a step
                    _DECODE,
                    step_buffers.seq_lens_cpu[step, :bucket] if host_lengths else None,
                )
            )
        return self._replay_static(bucket, static_bucket, size)  # type: ignore[no-any-return]
