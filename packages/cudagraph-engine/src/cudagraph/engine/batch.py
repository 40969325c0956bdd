"""Requests and the ``ForwardBatch``es built from them: extend (new prompt tokens, or a chunk of them, possibly with
running requests' next tokens mixed in), decode (one token each) and verify (the last token and the drafts of
speculative decoding).

A request reserves its KV slots for its whole budget (prompt plus new tokens) when it is admitted, so a step never
allocates; building a batch is host bookkeeping plus one host-to-device copy per field (written straight into a
graph runner's static buffers where it gives ``input_views``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from cudagraph.runner import ForwardBatch, ForwardMode


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples: greedy when ``temperature`` is 0; ``lora_name``: through that adapter."""

    max_new_tokens: int = 16
    temperature: float = 0.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()
    lora_name: str | None = None
    """The LoRA adapter the request runs through: the name it was loaded under (``ModelRunner.load_lora_adapter``,
    as SGLang's ``lora_path`` or vLLM's ``LoRARequest`` name); ``None``: the base model."""

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


def _step_batch(
    mode: ForwardMode,
    requests: list[Request],
    new_tokens: list[list[int]],
    device: torch.device,
    into: Mapping[str, torch.Tensor] | None = None,
    extend_tensors: Mapping[str, torch.Tensor] | None = None,
    starts: list[int] | None = None,
    **extend: Any,
) -> ForwardBatch:
    """The batch of ``mode`` feeding each request its ``new_tokens`` at the positions after its cached ones (their
    keys and values going to its next slots), request after request (``starts``: at the positions from
    ``starts[i]`` instead); ``extend_tensors`` (CPU tensors, one row a request) and ``extend`` (host values) set the
    extend fields.

    ``into``: a graph runner's ``input_views`` for this step; the tensor fields are written there (one host-to-device
    copy each, as without them) and the batch views them, so the runner's replay copies nothing."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[torch.Tensor] = []
    seq_lens: list[int] = []
    for index, (request, tokens) in enumerate(zip(requests, new_tokens, strict=True)):
        start = request.cached_len if starts is None else starts[index]
        end = start + len(tokens)
        input_ids += tokens
        positions += range(start, end)
        slots.append(_slots(request, start, end))
        seq_lens.append(end)
    seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int32)
    host = {
        "input_ids": torch.tensor(input_ids, dtype=torch.int64),
        "positions": torch.tensor(positions, dtype=torch.int64),
        "seq_lens": seq_lens_cpu,
        "req_pool_indices": torch.tensor([r.req_pool_index for r in requests], dtype=torch.int64),
        "out_cache_loc": torch.cat(slots),
        **(extend_tensors or {}),
    }
    fields: Mapping[str, torch.Tensor]
    if into is None:
        fields = {**{name: tensor.to(device) for name, tensor in host.items()}, "seq_lens_cpu": seq_lens_cpu}
    else:
        fields = into
        for name, tensor in host.items():
            fields[name].copy_(tensor, non_blocking=True)
        fields["seq_lens_cpu"].copy_(seq_lens_cpu)
    return ForwardBatch(
        forward_mode=mode,
        batch_size=len(requests),
        input_ids=fields["input_ids"],
        positions=fields["positions"],
        seq_lens=fields["seq_lens"],
        req_pool_indices=fields["req_pool_indices"],
        out_cache_loc=fields["out_cache_loc"],
        seq_lens_sum=sum(seq_lens),
        seq_lens_cpu=fields["seq_lens_cpu"],
        extend_seq_lens=fields.get("extend_seq_lens"),
        extend_prefix_lens=fields.get("extend_prefix_lens"),
        extend_start_loc=fields.get("extend_start_loc"),
        **extend,
    )


def extend_lens(requests: list[Request], limits: list[int] | None = None) -> list[int]:
    """The tokens each request feeds to ``make_extend_batch(requests, device, limits)``: every uncached one, or at
    most ``limits[i]`` of them (their sum is what a prefill runner routes the step by)."""
    if limits is None:
        return [request.uncached for request in requests]
    return [min(request.uncached, limit) for request, limit in zip(requests, limits, strict=True)]


def make_extend_batch(
    requests: list[Request],
    device: torch.device,
    limits: list[int] | None = None,
    into: Mapping[str, torch.Tensor] | None = None,
) -> ForwardBatch:
    """Every uncached token of ``requests`` (a prompt, what is left of it, or a decoding request's last token), one
    request after another; with ``limits``, at most ``limits[i]`` of request ``i``'s (a chunk of a long prompt);
    ``into``: written into a prefill runner's input views."""
    lens = extend_lens(requests, limits)
    new_tokens = [
        request.token_ids[request.cached_len : request.cached_len + length]
        for request, length in zip(requests, lens, strict=True)
    ]
    prefix_lens = [request.cached_len for request in requests]
    start_locs = [sum(lens[:i]) for i in range(len(lens))]
    return _step_batch(
        ForwardMode.EXTEND,
        requests,
        new_tokens,
        device,
        into,
        {
            "extend_seq_lens": torch.tensor(lens, dtype=torch.int32),
            "extend_prefix_lens": torch.tensor(prefix_lens, dtype=torch.int32),
            "extend_start_loc": torch.tensor(start_locs, dtype=torch.int32),
        },
        extend_num_tokens=sum(lens),
        extend_seq_lens_cpu=lens,
        extend_prefix_lens_cpu=prefix_lens,
    )


def make_decode_batch(
    requests: list[Request], device: torch.device, into: Mapping[str, torch.Tensor] | None = None
) -> ForwardBatch:
    """The last token of each request (all earlier tokens cached); ``into``: written into a runner's input views."""
    return _step_batch(ForwardMode.DECODE, requests, [[request.token_ids[-1]] for request in requests], device, into)


def make_verify_batch(
    requests: list[Request],
    drafts: list[list[int]],
    device: torch.device,
    into: Mapping[str, torch.Tensor] | None = None,
) -> ForwardBatch:
    """A speculative verify step: each request's last token then its drafts (the same number for every request),
    at the positions after its cached tokens, their keys and values written to its next slots; ``into``: written
    into a runner's input views."""
    if len(drafts) != len(requests) or len({len(draft) for draft in drafts}) > 1:
        raise ValueError(
            f"a verify step needs one draft per request, all of one length; got {len(requests)} requests and drafts "
            f"of lengths {[len(draft) for draft in drafts]}"
        )
    new_tokens = [[request.token_ids[-1], *draft] for request, draft in zip(requests, drafts, strict=True)]
    return _step_batch(ForwardMode.TARGET_VERIFY, requests, new_tokens, device, into)


def make_rows_batch(
    mode: ForwardMode, requests: list[Request], new_tokens: list[list[int]], starts: list[int], device: torch.device
) -> ForwardBatch:
    """A decode-shaped (``mode`` decode, one row a request) or verify-shaped (``TARGET_VERIFY``, the same number of
    rows for every request) step feeding request ``i`` the tokens ``new_tokens[i]`` at the positions from
    ``starts[i]``, their keys and values going to the request's slots at those positions, whatever it has cached:
    the steps of an EAGLE draft model, which shares the target's slots and runs ahead of the target's cache."""
    return _step_batch(mode, requests, new_tokens, device, starts=starts)
