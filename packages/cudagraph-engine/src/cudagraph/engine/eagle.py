"""``EagleModelRunner``: the runner of an EAGLE draft head (``model.eagle.EagleHead``) beside a target
``ModelRunner``, what ``cudagraph.runner``'s draft runners drive (``DraftModelRunnerLike``).

- Its KV cache is its own (one layer) but indexed like the target's: it shares the target's request table
  (``req_to_token_pool``) and has as many slots, so the head's keys and values of a position live in the slot the
  target's of that position live in. Nothing is allocated per request: the target's reservation (its budget plus the
  drafter's lookahead) covers every position a draft step writes.
- ``attn_backend`` (the draft extend's and the draft prefill's) and ``step_attn_backends`` (one per draft step, each
  with its own metadata) attend over that cache; they are of the target's kind.
- ``draft_forward(batch, attn_backend)`` gives logits and hidden states of every row, prepared as
  ``ModelRunner.forward`` prepares a step (the backend's metadata, the forward context), its traceable part being
  ``draft_model_forward`` (or the compiling backend's compiled one, so ``tc_piecewise`` runs).
- ``init_cuda_graphs()`` captures a ``DraftCudaGraphRunner`` of ``k - 1`` chained steps and a
  ``DraftExtendCudaGraphRunner`` of ``k + 1`` rows a request with the decode phase's config (its backend, buckets and
  graph pool); ``draft_steps`` and ``draft_extend`` replay them, or run the same steps eagerly without them.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from cudagraph.backend_utils import ForwardContext, compiled_model_forward, freeze_gc, set_forward_context
from cudagraph.config import Phase
from cudagraph.runner import (
    DraftCudaGraphRunner,
    DraftExtendCudaGraphRunner,
    DraftSeed,
    EagerReason,
    ForwardBatch,
    ReplayMetrics,
    RunnerConfig,
)
from cudagraph.runner.draft import next_step_batch
from cudagraph.runner.draft_extend import seed_of

from .attention import make_attention_backend
from .attention.op import attend
from .kv_cache import TokenToKVPool
from .model.eagle import EagleHead
from .model_runner import ModelRunner, ModelShape

logger = logging.getLogger(__name__)


class EagleModelRunner:
    """Runs ``head`` for ``num_tokens`` drafts a step beside ``target`` (see the module docstring). ``target`` must
    keep its hidden states (``ModelRunner(keep_hidden_states=k + 1)``) for the drafter to read them."""

    def __init__(self, target: ModelRunner, head: EagleHead, num_tokens: int, *, show_progress: bool = False) -> None:
        if num_tokens < 1:
            raise ValueError(f"num_tokens={num_tokens}: an EAGLE drafter drafts at least one token a step")
        self.target = target
        self.model = head
        self.num_tokens = num_tokens
        """``k``: drafts a step (the chain runs ``k - 1`` steps after the seed)."""
        self.device: torch.device = target.device
        self.dtype: torch.dtype = target.dtype
        self.hidden_size: int = head.config.hidden_size
        self.cuda_graph_config = target.cuda_graph_config
        self.show_progress = show_progress
        self.req_to_token_pool = target.req_to_token_pool
        self.shape = ModelShape.of(head.local_config)
        cache = target.cache_config
        self.token_to_kv_pool = TokenToKVPool(
            cache.resolved_slots(),
            self.shape.num_layers,
            self.shape.num_kv_heads,
            self.shape.head_dim,
            self.dtype,
            self.device,
            page_size=cache.page_size,
        )
        name = target.attention_backend_name
        self.attn_backend: Any = self._attention(name)
        self.step_attn_backends: list[Any] = [self._attention(name) for _ in range(max(num_tokens - 1, 1))]
        head.use_kernels(target.kernels)
        self.draft_cuda_graph_runner: DraftCudaGraphRunner | None = None
        self.draft_extend_cuda_graph_runner: DraftExtendCudaGraphRunner | None = None
        self.draft_metrics = ReplayMetrics(Phase.DECODE, label="draft")
        """Every chain of draft steps (counted by requests), replayed or eager."""
        self.draft_extend_metrics = ReplayMetrics(Phase.DECODE, label="draft extend")
        """Every draft extend step, replayed or eager."""

    def _attention(self, name: str) -> Any:
        return make_attention_backend(name, self.req_to_token_pool, self.token_to_kv_pool, self.shape)

    # -- forwards -------------------------------------------------------------------------------------------------

    def draft_model_forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor
    ) -> torch.Tensor:
        """The head's hidden states ``[T, H]``: the traceable part of ``draft_forward`` (no forward-context reads:
        the attention operator reads the step from the context inside itself)."""
        return self.model.forward(input_ids, positions, hidden_states, attend)

    @torch.no_grad()
    def draft_forward(self, batch: ForwardBatch, attn_backend: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[T, vocab]`` and hidden states ``[T, H]`` of every row of ``batch`` (its ``hidden_states`` the
        ones handed to its tokens), attending through ``attn_backend``. No host sync under capture."""
        if batch.hidden_states is None:
            raise ValueError("an EAGLE draft step reads the hidden states handed to it: batch.hidden_states is None")
        attn_backend.init_forward_metadata(batch)
        model_forward = compiled_model_forward() or self.draft_model_forward
        context = ForwardContext(forward_batch=batch, attn_backend=attn_backend, extra={})
        with set_forward_context(context):
            hidden = model_forward(batch.input_ids, batch.positions, batch.hidden_states)
        return self.model.compute_logits(hidden), hidden

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits of every row of ``batch`` through ``attn_backend`` (``ModelRunnerLike``; the drafter calls
        ``draft_forward``)."""
        return self.draft_forward(batch, self.attn_backend)[0]

    # -- graphs ---------------------------------------------------------------------------------------------------

    def init_cuda_graphs(self, backend: Any = None) -> None:
        """Capture the chain's graphs (``k - 1`` steps; none when ``k`` is 1) and the draft extend's (``k + 1`` rows
        a request) with the decode phase's config. Without ``backend`` (a graph backend the runners take, e.g. the
        CPU double in tests) only where the target's decode phase is graphed; else the steps run eagerly."""
        if backend is None:
            reason = self.target.runnerless_reason(Phase.DECODE)
            if reason is not EagerReason.NOT_CAPTURED:
                logger.info("EAGLE draft steps run eagerly: the decode phase is not graphed (%s)", reason)
                return
        config = RunnerConfig.of(self.cuda_graph_config, Phase.DECODE)
        options: dict[str, Any] = {"backend": backend, "show_progress": self.show_progress}
        # Both captures in one garbage-collector block: one full collection, not one per runner (most of a small
        # model's capture time).
        with freeze_gc(enable_gc=config.switches.enable_gc):
            if self.num_tokens > 1:
                chain = DraftCudaGraphRunner(
                    self, config, num_steps=self.num_tokens - 1, metrics=self.draft_metrics, **options
                )
                self.draft_cuda_graph_runner = _captured(chain)
            extend = DraftExtendCudaGraphRunner(
                self, config, query_len=self.num_tokens + 1, metrics=self.draft_extend_metrics, **options
            )
            self.draft_extend_cuda_graph_runner = _captured(extend)

    def shutdown(self) -> None:
        """Free the draft graphs (the head and its KV cache stay)."""
        for runner in (self.draft_cuda_graph_runner, self.draft_extend_cuda_graph_runner):
            if runner is not None:
                runner.shutdown()
        self.draft_cuda_graph_runner = self.draft_extend_cuda_graph_runner = None

    # -- steps ----------------------------------------------------------------------------------------------------

    def draft_steps(self, batch: ForwardBatch) -> torch.Tensor:
        """The tokens ``[B, k - 1]`` the chain drafts from the decode-shaped ``batch`` (each request's seed token,
        position, slot and hidden state): its graph replayed, or the same steps run eagerly."""
        runner = self.draft_cuda_graph_runner
        if runner is not None:
            return runner.replay(batch)
        self.draft_metrics.count_eager(self.target.runnerless_reason(Phase.DECODE), batch.num_tokens)
        return self.draft_chain_eagerly(batch)

    def draft_chain_eagerly(self, batch: ForwardBatch) -> torch.Tensor:
        """``draft_steps`` with no graph: step ``i`` through ``step_attn_backends[i]``, its token and hidden state the
        next step's (what the draft runner's graph holds)."""
        req_to_token = self.req_to_token_pool.req_to_token
        tokens: list[torch.Tensor] = []
        step_batch = batch
        for step in range(self.num_tokens - 1):
            logits, hidden = self.draft_forward(step_batch, self.step_attn_backends[step])
            tokens.append(logits.argmax(dim=-1))
            step_batch = next_step_batch(batch, step + 1, req_to_token)
            step_batch.input_ids, step_batch.hidden_states = tokens[-1], hidden
        return torch.stack(tokens, dim=1)

    def draft_extend(self, batch: ForwardBatch) -> DraftSeed:
        """Each request's seed after a verify step (the verify-shaped ``batch`` of ``k + 1`` rows a request, its
        ``accepted_lens`` real): the extend graph replayed, or the same step run eagerly. A graph's seed views its
        static output (the next replay overwrites it)."""
        runner = self.draft_extend_cuda_graph_runner
        if runner is not None:
            return runner.replay(batch)
        self.draft_extend_metrics.count_eager(self.target.runnerless_reason(Phase.DECODE), batch.num_tokens)
        assert batch.accepted_lens is not None
        logits, hidden = self.draft_forward(batch, self.attn_backend)
        return seed_of(logits, hidden, batch.accepted_lens, self.num_tokens + 1)

    def draft_prefill(self, batch: ForwardBatch) -> DraftSeed:
        """Each request's seed after the target's prefill: the extend ``batch`` over its prompt and the target's
        first token (hidden state of position 0: zeros), eagerly; the seed is its last row's."""
        assert batch.extend_start_loc is not None and batch.extend_seq_lens is not None
        logits, hidden = self.draft_forward(batch, self.attn_backend)
        last = (batch.extend_start_loc + batch.extend_seq_lens - 1).long()
        return DraftSeed(logits.index_select(0, last).argmax(dim=-1), hidden.index_select(0, last))


def _captured(runner: Any) -> Any:
    try:
        runner.capture()
    except BaseException:
        runner.shutdown()
        raise
    return runner
