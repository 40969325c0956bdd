"""What one forward step carries from the engine to a runner: the mode, the tokens, and where their KV goes.

Plain data: nothing here launches device work, so building a batch is free of host syncs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .routing import Route

PADDING_REQ_POOL_INDEX = 0
"""Request-to-token row reserved as scratch: padded rows of a graph point here, the engine never hands it out."""

PADDING_KV_SLOT = 0
"""KV slot reserved as scratch: padded tokens write their keys and values here, the engine never hands it out."""


class ForwardMode(enum.IntEnum):
    """What kind of step a batch is: one new token per request, a run of new tokens per request, the same number of
    new tokens per request (a speculative step's verify), or nothing."""

    DECODE = 1
    EXTEND = 2
    IDLE = 3
    TARGET_VERIFY = 4
    """Speculative decoding's verify step: every request feeds its last token and the same number of draft tokens
    (``query_len`` tokens each, request after request), and the step returns the logits of every token. A uniform
    step like decode: graphed by the decode phase's backend, keyed by request count and query length."""

    def is_decode(self) -> bool:
        """One token per request (decode graphs are keyed by batch size)."""
        return self is ForwardMode.DECODE

    def is_extend(self) -> bool:
        """Prefill or chunked prefill: any number of tokens per request (prefill graphs are keyed by token count)."""
        return self is ForwardMode.EXTEND

    def is_verify(self) -> bool:
        """A verify step: ``query_len`` tokens per request, logits of every token."""
        return self is ForwardMode.TARGET_VERIFY

    def is_uniform(self) -> bool:
        """Every request brings the same number of tokens (decode, verify): a graph keyed by request count serves
        it. Extend batches are not: their requests differ."""
        return self is ForwardMode.DECODE or self is ForwardMode.TARGET_VERIFY

    def is_idle(self) -> bool:
        """No tokens at all: a rank with nothing to do still runs the graph so collectives stay aligned."""
        return self is ForwardMode.IDLE


@dataclass
class ForwardBatch:
    """One step's inputs, all on the engine's device unless the name ends in ``_cpu``.

    ``T`` is the number of tokens (decode: ``T == batch_size``; verify: ``T == batch_size * query_len``), ``B`` the
    number of requests. The ``extend_*`` fields are ``None`` in decode, verify and idle batches.
    """

    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    """[T] int64 token ids."""
    positions: torch.Tensor
    """[T] int64 position of each token in its request."""
    seq_lens: torch.Tensor
    """[B] int32 length of each request including this step's tokens."""
    req_pool_indices: torch.Tensor
    """[B] int64 row of each request in the request-to-token table."""
    out_cache_loc: torch.Tensor
    """[T] int64 KV slot each token's keys and values are written to."""
    seq_lens_sum: int
    seq_lens_cpu: torch.Tensor | None = None
    extend_seq_lens: torch.Tensor | None = None
    """[B] int32 new tokens of each request."""
    extend_prefix_lens: torch.Tensor | None = None
    """[B] int32 tokens of each request already in the KV cache."""
    extend_start_loc: torch.Tensor | None = None
    """[B] int32 index of each request's first new token in ``input_ids``."""
    extend_num_tokens: int | None = None
    extend_seq_lens_cpu: list[int] | None = None
    extend_prefix_lens_cpu: list[int] | None = None
    attn_metadata: Any = None
    hidden_states: torch.Tensor | None = None
    """[T, H] the hidden states a draft model's step reads beside its tokens (EAGLE-style drafting: the target's
    hidden state of the token before each one, or the draft's own from its previous step); ``None`` elsewhere."""
    accepted_lens: torch.Tensor | None = None
    """[B] int64 (a draft extend step): the real rows of each request's ``query_len`` rows (the drafts the target
    accepted and its own next token), at least 1; the step returns each request's last real row."""
    route: Route | None = None
    """The step's route, when the runner gave it before the batch was built (``step_inputs``): its ``replay`` then
    takes it as given instead of routing the batch again. ``None``: routed when it runs."""

    @property
    def num_tokens(self) -> int:
        """Tokens in this step (``T``)."""
        return int(self.input_ids.shape[0])
