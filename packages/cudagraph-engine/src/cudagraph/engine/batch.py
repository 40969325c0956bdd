"""Requests and the ``ForwardBatch``es built from them: extend (new prompt tokens, or a chunk of them, possibly with
running requests' next tokens mixed in), decode (one token each) and verify (the last token and the drafts of
speculative decoding).

A request reserves its KV slots for its whole budget (prompt plus new tokens) when it is admitted, so a step never
allocates; building a batch is host bookkeeping plus one host-to-device copy per field.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cudagraph.runner import ForwardBatch, ForwardMode


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples: greedy when ``temperature`` is 0."""

    max_new_tokens: int = 16
    temperature: float = 0.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be at least 1")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be 0 (greedy) or positive")


@dataclass(eq=False)
class Request:
    """One prompt being generated: its tokens so far, its cache row and slots, and how many are cached."""

    index: int
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    req_pool_index: int = -1
    kv_slots: torch.Tensor | None = None
    """CPU int64 slots for the whole budget, in token order."""
    cached_len: int = 0
    """Tokens whose keys and values are in the cache."""
    generator: torch.Generator | None = None
    lookahead: int = 0
    """KV slots reserved past the last token for draft tokens (speculative decoding verifies them in the cache)."""

    @property
    def token_ids(self) -> list[int]:
        """Prompt then generated tokens."""
        return self.prompt_ids + self.output_ids

    @property
    def budget(self) -> int:
        """KV slots the request can ever need (the last sampled token is never fed back), drafts' included."""
        return len(self.prompt_ids) + self.params.max_new_tokens - 1 + self.lookahead

    @property
    def uncached(self) -> int:
        """Tokens not yet in the cache (a decoding request: its last token)."""
        return len(self.token_ids) - self.cached_len

    @property
    def prefilled(self) -> bool:
        """Whether its whole prompt is in the cache (what is left is decoding)."""
        return self.cached_len >= len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        """Whether it has all its tokens or produced a stop token."""
        if len(self.output_ids) >= self.params.max_new_tokens:
            return True
        return bool(self.output_ids) and self.output_ids[-1] in self.params.stop_token_ids


def _slots(request: Request, start: int, stop: int) -> torch.Tensor:
    assert request.kv_slots is not None, "request has no KV slots; admit it first"
    return request.kv_slots[start:stop]


def make_extend_batch(requests: list[Request], device: torch.device, limits: list[int] | None = None) -> ForwardBatch:
    """Every uncached token of ``requests`` (a prompt, what is left of it, or a decoding request's last token), one
    request after another; with ``limits``, at most ``limits[i]`` of request ``i``'s (a chunk of a long prompt)."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[torch.Tensor] = []
    extend_lens: list[int] = []
    prefix_lens: list[int] = []
    seq_lens: list[int] = []
    for index, request in enumerate(requests):
        tokens = request.token_ids
        end = len(tokens) if limits is None else min(len(tokens), request.cached_len + limits[index])
        new = tokens[request.cached_len : end]
        input_ids += new
        positions += range(request.cached_len, end)
        slots.append(_slots(request, request.cached_len, end))
        extend_lens.append(len(new))
        prefix_lens.append(request.cached_len)
        seq_lens.append(end)
    start_locs = [sum(extend_lens[:i]) for i in range(len(extend_lens))]
    seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int32)
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=len(requests),
        input_ids=torch.tensor(input_ids, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        seq_lens=seq_lens_cpu.to(device),
        req_pool_indices=torch.tensor([r.req_pool_index for r in requests], dtype=torch.int64, device=device),
        out_cache_loc=torch.cat(slots).to(device),
        seq_lens_sum=sum(seq_lens),
        seq_lens_cpu=seq_lens_cpu,
        extend_seq_lens=torch.tensor(extend_lens, dtype=torch.int32, device=device),
        extend_prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32, device=device),
        extend_start_loc=torch.tensor(start_locs, dtype=torch.int32, device=device),
        extend_num_tokens=len(input_ids),
        extend_seq_lens_cpu=extend_lens,
        extend_prefix_lens_cpu=prefix_lens,
    )


def make_decode_batch(requests: list[Request], device: torch.device) -> ForwardBatch:
    """The last token of each request (all earlier tokens cached)."""
    positions = [request.cached_len for request in requests]
    seq_lens_cpu = torch.tensor([p + 1 for p in positions], dtype=torch.int32)
    slots = [_slots(request, request.cached_len, request.cached_len + 1) for request in requests]
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=len(requests),
        input_ids=torch.tensor([r.token_ids[-1] for r in requests], dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        seq_lens=seq_lens_cpu.to(device),
        req_pool_indices=torch.tensor([r.req_pool_index for r in requests], dtype=torch.int64, device=device),
        out_cache_loc=torch.cat(slots).to(device),
        seq_lens_sum=int(seq_lens_cpu.sum()),
        seq_lens_cpu=seq_lens_cpu,
    )


def make_verify_batch(requests: list[Request], drafts: list[list[int]], device: torch.device) -> ForwardBatch:
    """A speculative verify step: each request's last token then its drafts (the same number for every request),
    at the positions after its cached tokens, their keys and values written to its next slots."""
    query_len = 1 + len(drafts[0]) if drafts else 1
    if any(len(draft) != query_len - 1 for draft in drafts) or len(drafts) != len(requests):
        raise ValueError(
            f"a verify step needs one draft per request, all of one length; got {len(requests)} requests and drafts "
            f"of lengths {[len(draft) for draft in drafts]}"
        )
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[torch.Tensor] = []
    seq_lens: list[int] = []
    for request, draft in zip(requests, drafts, strict=True):
        start = request.cached_len
        input_ids += [request.token_ids[-1], *draft]
        positions += range(start, start + query_len)
        slots.append(_slots(request, start, start + query_len))
        seq_lens.append(start + query_len)
    seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int32)
    return ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY,
        batch_size=len(requests),
        input_ids=torch.tensor(input_ids, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        seq_lens=seq_lens_cpu.to(device),
        req_pool_indices=torch.tensor([r.req_pool_index for r in requests], dtype=torch.int64, device=device),
        out_cache_loc=torch.cat(slots).to(device),
        seq_lens_sum=sum(seq_lens),
        seq_lens_cpu=seq_lens_cpu,
    )
