"""A small continuous-batching generate loop: new prompts join between decode steps of the running ones.

Each iteration either prefills the prompts that fit (request rows, KV slots, a token budget) or, when none is
waiting or none fits, decodes one token for every running request. Finished requests give their row and slots back
at once, so the next waiting prompt can join.

Two step kinds change that loop (``StepPolicy``):

- ``mixed``: one extend step a iteration carries every running request's next token and as much of the waiting
  prompts as the token budget leaves (a long prompt in chunks): chunked prefill mixed with decodes, a non-uniform
  step the prefill phase's graphs replay.
- ``speculative``: decode steps become verify steps: a drafter (``NgramDrafter``, or ``DraftModelDrafter`` with a
  smaller model) drafts ``k`` tokens per request, one step
  checks them all (``k + 1`` tokens a request, a uniform step the verify runner's full graphs replay), and
  ``accept_greedy`` keeps what the target agrees with. Greedy requests only.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .batch import Request, SamplingParams
from .kv_cache import CacheFullError
from .model_runner import ModelRunner
from .speculative import Drafter, TargetStepDrafter, accept_greedy


@dataclass(frozen=True)
class GenerationOutput:
    """What one prompt produced."""

    output_token_ids: list[int]


@dataclass
class GenerationStats:
    """Steps the loop ran, by kind, what speculation gained, and how long it took (``speed`` reads these)."""

    prefill_steps: int = 0
    decode_steps: int = 0
    mixed_steps: int = 0
    """Extend steps that carried running requests' next tokens beside prompt tokens."""
    verify_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    """Drafts the target agreed with (each saved a decode step)."""
    seconds: float = 0.0
    """Wall time of ``Scheduler.run``."""
    first_token_s: list[float] = field(default_factory=list)
    """Per request, in the order their first tokens came: seconds from the start of ``run`` to that token."""
    decode_seconds: float = 0.0
    """Wall time of the decode and verify steps (each ends in a host read of its tokens, so it includes the
    device's work)."""
    decode_tokens: int = 0
    """Tokens the decode and verify steps produced."""


@dataclass(frozen=True)
class StepPolicy:
    """How the loop builds its steps: ``mixed`` (chunked prefill mixed with decodes in one extend step) and
    ``drafter`` (speculative verify steps instead of decode steps). The two are exclusive."""

    mixed: bool = False
    drafter: Drafter | None = None

    def __post_init__(self) -> None:
        if self.mixed and self.drafter is not None:
            raise ValueError(
                "mixed steps and speculative decoding are exclusive here: a verify step is uniform (every request "
                "k + 1 tokens) and a mixed step is not; pick one"
            )

    @property
    def lookahead(self) -> int:
        """KV slots each request reserves past its budget for drafts."""
        return self.drafter.num_tokens if self.drafter is not None else 0


def sample(logits: torch.Tensor, requests: Sequence[Request]) -> list[int]:
    """One token per row: argmax for greedy requests, a draw from ``softmax(logits / T)`` for the others."""
    tokens = logits.argmax(dim=-1).tolist()
    for row, request in enumerate(requests):
        temperature = request.params.temperature
        if temperature > 0:
            probs = torch.softmax(logits[row].float() / temperature, dim=-1)
            tokens[row] = int(torch.multinomial(probs, 1, generator=request.generator))
    return tokens


GREEDY = SamplingParams()
"""Greedy decoding of 16 new tokens."""


class Scheduler:
    """Admits waiting requests into the KV cache, builds steps, and retires finished requests."""

    def __init__(
        self, model_runner: ModelRunner, max_prefill_tokens: int | None = None, policy: StepPolicy | None = None
    ) -> None:
        self.model_runner = model_runner
        self.policy = policy or StepPolicy()
        check_target = getattr(self.policy.drafter, "check_target", None)
        if check_target is not None:  # a draft model must share the target's vocabulary
            check_target(model_runner)
        prefill_runner = model_runner.prefill_cuda_graph_runner
        # By default a prefill step is as large as the largest prefill graph, so prefill steps replay graphs.
        default = prefill_runner.max_size if prefill_runner is not None else model_runner.cache_config.max_context_len
        self.max_prefill_tokens = max_prefill_tokens or default
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = GenerationStats()
        self._started = time.perf_counter()
        self._tokens_made = 0

    def add(self, request: Request) -> None:
        """Queue ``request``; reject one that could never fit the cache (or, speculating, one that samples)."""
        if self.policy.drafter is not None and request.params.temperature > 0:
            raise ValueError(
                f"prompt {request.index} samples with temperature {request.params.temperature}, but speculative "
                "decoding here is greedy only (temperature 0)"
            )
        request.lookahead = self.policy.lookahead
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
            # Mixed steps chunk a long prompt, so any prompt fits the budget; otherwise a prompt goes whole.
            fits_budget = (
                not admitted or self.policy.mixed or tokens + len(request.prompt_ids) <= self.max_prefill_tokens
            )
            if not (fits_budget and req_pool.available and kv_pool.available >= request.budget):
                break
            self.waiting.popleft()
            self.model_runner.hold(request)
            device = self.model_runner.device
            request.generator = torch.Generator(device=device).manual_seed(request.params.seed + request.index)
            admitted.append(request)
            tokens += len(request.prompt_ids)
        if not admitted and not self.running and self.waiting:
            raise CacheFullError(f"prompt {self.waiting[0].index} does not fit an empty KV cache")
        return admitted

    def _retire(self, request: Request) -> None:
        self.model_runner.release(request)
        if self.policy.drafter is not None:
            self.policy.drafter.release(request)

    def step(self) -> None:
        """One step of the policy's kind (see the module docstring); retire what finished. A decode or verify step
        adds its wall time and its tokens to ``stats.decode_seconds`` and ``stats.decode_tokens``."""
        started = time.perf_counter()
        decodes_before = self.stats.decode_steps + self.stats.verify_steps
        tokens_before = self._tokens_made
        self._step()
        if self.stats.decode_steps + self.stats.verify_steps > decodes_before:
            self.stats.decode_seconds += time.perf_counter() - started
            self.stats.decode_tokens += self._tokens_made - tokens_before

    def _step(self) -> None:
        admitted = self._admit()
        if self.policy.mixed:
            self._mixed_step(admitted)
        elif admitted:
            self._extend_step(admitted)
            self.stats.prefill_steps += 1
        elif self.policy.drafter is not None:
            self._verify_step(self.policy.drafter)
        else:
            batch = self.model_runner.decode_batch(self.running)
            self._sample_into(self.running, self.model_runner.run(batch))
            self.stats.decode_steps += 1
        still_running = [r for r in self.running if r not in admitted] + admitted
        self.running = []
        for request in still_running:
            if request.finished:
                self._retire(request)
            else:
                self.running.append(request)

    def _sample_into(self, requests: Sequence[Request], logits: torch.Tensor) -> None:
        tokens = sample(logits, requests)  # reads the tokens to the host: the step's device work is done
        now = time.perf_counter() - self._started
        for request, token in zip(requests, tokens, strict=True):
            request.cached_len = len(request.token_ids)
            if not request.output_ids:
                self.stats.first_token_s.append(now)
            request.output_ids.append(token)
        self._tokens_made += len(tokens)

    def _extend_step(self, requests: list[Request], limits: list[int] | None = None) -> None:
        """One extend step over ``requests`` (chunks of at most ``limits`` tokens); a request whose every token is
        then cached samples its next one, a chunk of a longer prompt only fills the cache."""
        logits = self.model_runner.run(self.model_runner.extend_batch(requests, limits))
        if limits is None:
            self._sample_into(requests, logits)
            drafter = self.policy.drafter
            if isinstance(drafter, TargetStepDrafter):  # reads this step's hidden states: now, before the next step
                drafter.after_prefill(requests)
            return
        done = [row for row, request in enumerate(requests) if limits[row] >= request.uncached]
        for request, limit in zip(requests, limits, strict=True):
            if limit < request.uncached:
                request.cached_len += limit
        self._sample_into([requests[row] for row in done], logits[done])

    def _mixed_step(self, admitted: list[Request]) -> None:
        """Every decoding request's next token, then prompt tokens (oldest request first) up to the token budget, in
        one extend step; a step with no prompt tokens left is a plain decode step (uniform: the decode graphs)."""
        decoding = [r for r in self.running if r.prefilled]
        prefilling = [r for r in self.running if not r.prefilled] + admitted
        budget = max(self.max_prefill_tokens - len(decoding), 0)
        chunks: list[int] = []
        for request in prefilling:
            chunks.append(min(request.uncached, budget))
            budget -= chunks[-1]
        taken = [(r, n) for r, n in zip(prefilling, chunks, strict=True) if n > 0]
        if not taken:  # only decodes: a uniform step, for the decode graphs
            self._sample_into(decoding, self.model_runner.run(self.model_runner.decode_batch(decoding)))
            self.stats.decode_steps += 1
            return
        requests = decoding + [r for r, _ in taken]
        self._extend_step(requests, [1] * len(decoding) + [n for _, n in taken])
        if decoding:
            self.stats.mixed_steps += 1
        else:
            self.stats.prefill_steps += 1

    def _verify_step(self, drafter: Drafter) -> None:
        """Draft for every running request, verify all drafts in one step, keep what the target agrees with."""
        requests = self.running
        drafts = drafter.propose_batch(requests)
        batch = self.model_runner.verify_batch(requests, drafts)
        query_len = drafter.num_tokens + 1
        target = self.model_runner.run(batch).argmax(dim=-1).view(len(requests), query_len).tolist()
        accepted: list[int] = []
        for request, draft, target_tokens in zip(requests, drafts, target, strict=True):
            new_tokens = accept_greedy(draft, target_tokens)
            accepted.append(len(new_tokens) - 1)
            room = request.params.max_new_tokens - len(request.output_ids)
            for token in new_tokens[:room]:
                request.output_ids.append(token)
                self._tokens_made += 1
                if token in request.params.stop_token_ids:
                    break
            request.cached_len = len(request.token_ids) - 1
            self.stats.drafted_tokens += len(draft)
            self.stats.accepted_tokens += len(new_tokens) - 1
        self.stats.verify_steps += 1
        if isinstance(drafter, TargetStepDrafter):
            drafter.after_verify(requests, accepted)

    def run(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams] = GREEDY
    ) -> list[GenerationOutput]:
        """Queue a request per prompt and step until everything finished; outputs in prompt order (``stats`` then
        counts the steps it took)."""
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(per_prompt) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(per_prompt)} sampling params")
        requests = [Request(i, list(p), sp) for i, (p, sp) in enumerate(zip(prompts, per_prompt, strict=True))]
        for request in requests:
            self.add(request)
        self._started = time.perf_counter()
        while not self.done:
            self.step()
        self.stats.seconds = time.perf_counter() - self._started
        return [GenerationOutput(list(request.output_ids)) for request in requests]

    @property
    def done(self) -> bool:
        """Whether nothing is waiting or running."""
        return not self.waiting and not self.running


def generate(
    model_runner: ModelRunner,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams | Sequence[SamplingParams] = GREEDY,
    *,
    max_prefill_tokens: int | None = None,
    policy: StepPolicy | None = None,
) -> list[GenerationOutput]:
    """Generate for every prompt (token ids), continuously batched; outputs in prompt order. ``policy`` picks mixed
    steps or speculative decoding (``StepPolicy``); greedy tokens are the same whichever it picks."""
    return Scheduler(model_runner, max_prefill_tokens, policy).run(prompts, params)
