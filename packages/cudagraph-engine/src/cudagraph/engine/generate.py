"""A small continuous-batching generate loop: new prompts join between decode steps of the running ones.

Each iteration either prefills the prompts that fit (request rows, KV slots, a token budget) or, when none is
waiting or none fits, decodes one token for every running request. Finished requests give their row and slots back
at once, so the next waiting prompt can join.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .batch import Request, SamplingParams, make_decode_batch, make_extend_batch
from .kv_cache import CacheFullError
from .model_runner import ModelRunner


@dataclass(frozen=True)
class GenerationOutput:
    """What one prompt produced."""

    output_token_ids: list[int]


@dataclass
class GenerationStats:
    """Steps the loop ran, by kind."""

    prefill_steps: int = 0
    decode_steps: int = 0


def sample(logits: torch.Tensor, requests: Sequence[Request]) -> list[int]:
    """One token per row: argmax for greedy requests, a draw from ``softmax(logits / T)`` for the others."""
    tokens = logits.argmax(dim=-1).tolist()
    for row, request in enumerate(requests):
        temperature = request.params.temperature
        if temperature > 0:
            probs = torch.softmax(logits[row].float() / temperature, dim=-1)
            tokens[row] = int(torch.multinomial(probs, 1, generator=request.generator))
    return tokens


class Scheduler:
    """Admits waiting requests into the KV cache, builds steps, and retires finished requests."""

    def __init__(self, model_runner: ModelRunner, max_prefill_tokens: int | None = None) -> None:
        self.model_runner = model_runner
        prefill_runner = model_runner.prefill_cuda_graph_runner
        # By default a prefill step is as large as the largest prefill graph, so prefill steps replay graphs.
        default = prefill_runner.max_size if prefill_runner is not None else model_runner.cache_config.max_context_len
        self.max_prefill_tokens = max_prefill_tokens or default
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = GenerationStats()

    def add(self, request: Request) -> None:
        """Queue ``request``; reject one that could never fit the cache."""
        max_context_len = self.model_runner.req_to_token_pool.max_context_len
        if request.budget > max_context_len:
            raise CacheFullError(
                f"prompt {request.index} needs {request.budget} tokens (prompt {len(request.prompt_ids)} + "
                f"{request.params.max_new_tokens} new - 1) but max_context_len is {max_context_len}"
            )
        if not request.prompt_ids:
            raise ValueError(f"prompt {request.index} is empty; every prompt needs at least one token")
        self.waiting.append(request)

    def _admit(self) -> list[Request]:
        req_pool, kv_pool = self.model_runner.req_to_token_pool, self.model_runner.token_to_kv_pool
        admitted: list[Request] = []
        tokens = 0
        while self.waiting:
            request = self.waiting[0]
            fits_budget = not admitted or tokens + len(request.prompt_ids) <= self.max_prefill_tokens
            if not (fits_budget and req_pool.available and kv_pool.available >= request.budget):
                break
            self.waiting.popleft()
            request.req_pool_index = req_pool.alloc()
            request.kv_slots = kv_pool.alloc(request.budget)
            req_pool.write(request.req_pool_index, 0, request.kv_slots)
            device = self.model_runner.device
            request.generator = torch.Generator(device=device).manual_seed(request.params.seed + request.index)
            admitted.append(request)
            tokens += len(request.prompt_ids)
        if not admitted and not self.running and self.waiting:
            raise CacheFullError(f"prompt {self.waiting[0].index} does not fit an empty KV cache")
        return admitted

    def _retire(self, request: Request) -> None:
        assert request.kv_slots is not None
        self.model_runner.token_to_kv_pool.free(request.kv_slots)
        self.model_runner.req_to_token_pool.free(request.req_pool_index)
        request.kv_slots, request.req_pool_index = None, -1

    def step(self) -> None:
        """Prefill what can be admitted, else decode every running request; retire what finished."""
        admitted = self._admit()
        if admitted:
            batch_requests = admitted
            batch = make_extend_batch(admitted, self.model_runner.device)
            self.stats.prefill_steps += 1
        else:
            batch_requests = self.running
            batch = make_decode_batch(self.running, self.model_runner.device)
            self.stats.decode_steps += 1
        logits = self.model_runner.run(batch)
        for request, token in zip(batch_requests, sample(logits, batch_requests), strict=True):
            request.cached_len = len(request.token_ids)
            request.output_ids.append(token)
        still_running = [r for r in self.running if r not in admitted] + admitted
        self.running = []
        for request in still_running:
            if request.finished:
                self._retire(request)
            else:
                self.running.append(request)

    @property
    def done(self) -> bool:
        """Whether nothing is waiting or running."""
        return not self.waiting and not self.running


GREEDY = SamplingParams()
"""Greedy decoding of 16 new tokens."""


def generate(
    model_runner: ModelRunner,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams | Sequence[SamplingParams] = GREEDY,
    *,
    max_prefill_tokens: int | None = None,
) -> list[GenerationOutput]:
    """Generate for every prompt (token ids), continuously batched; outputs in prompt order."""
    per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    if len(per_prompt) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(per_prompt)} sampling params")
    scheduler = Scheduler(model_runner, max_prefill_tokens)
    requests = [Request(i, list(p), sp) for i, (p, sp) in enumerate(zip(prompts, per_prompt, strict=True))]
    for request in requests:
        scheduler.add(request)
    while not scheduler.done:
        scheduler.step()
    return [GenerationOutput(list(request.output_ids)) for request in requests]
