"""Greedy speculative decoding: draft tokens (by n-gram lookup or with a draft model), verify them in one target
step, keep what agrees.

1. A ``Drafter`` proposes each request's next ``num_tokens`` tokens, always exactly that many, so a verify step is
   uniform and replays one graph. ``NgramDrafter`` looks them up in the request's own text: the continuation of the
   latest earlier occurrence of its last few tokens (prompt lookup), padded by repeating the last one.
   ``DraftModelDrafter`` runs a smaller model of the same vocabulary greedily: one extend step over what its cache
   lacks (the tokens the last verify step accepted), then ``num_tokens - 1`` decode steps, each replaying the draft
   engine's own graphs (prefill's, then decode's). ``EagleDrafter`` runs an EAGLE draft head (``cudagraph.engine.
   eagle``) over the target's hidden states, which the target hands over on the device: a draft extend after each
   verify step (one graph) seeds the first draft, a chain of ``num_tokens - 1`` draft steps (one graph) the rest.
2. The engine runs a verify step (``batch.make_verify_batch``): the last token and the drafts of every request,
   logits of every token.
3. ``accept_greedy`` keeps the drafts the target's argmax agrees with, up to the first disagreement, and adds the
   target's own token there: at least one new token a step, exactly the tokens plain greedy decoding would produce.

What it does not do: sampling with a temperature (rejection sampling), tree drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from cudagraph.runner import DraftSeed, ForwardMode

from .batch import Request, make_extend_batch, make_rows_batch

if TYPE_CHECKING:
    from .eagle import EagleModelRunner
    from .model_runner import ModelRunner


class Drafter(Protocol):
    """What proposes draft tokens for a verify step: ``num_tokens`` a request, every time."""

    @property
    def num_tokens(self) -> int:
        """Drafts per request and step (``k``: a verify step has ``k + 1`` tokens a request)."""
        ...

    def propose_batch(self, requests: Sequence[Request]) -> list[list[int]]:
        """``num_tokens`` drafts to follow each request's tokens."""
        ...

    def release(self, request: Request) -> None:
        """Forget ``request`` (it finished): give back whatever drafting it held."""
        ...


@runtime_checkable
class TargetStepDrafter(Protocol):
    """A drafter that reads the target's own steps (an EAGLE head reads the target's hidden states): the scheduler
    tells it right after each prefill step and each verify step, while the target's buffers still hold that step."""

    def after_prefill(self, requests: Sequence[Request]) -> None:
        """The target just prefilled ``requests`` (whole prompts, in this order) and sampled their first tokens."""
        ...

    def after_verify(self, requests: Sequence[Request], accepted: Sequence[int]) -> None:
        """The target just verified ``requests`` (in this order); request ``i`` kept ``accepted[i]`` drafts and the
        target's own token after them (already appended to it)."""
        ...


def check_num_tokens(num_tokens: int) -> None:
    """Raise ``ValueError`` unless a drafter's ``num_tokens`` is at least one."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens={num_tokens}: a speculative step drafts at least one token")


@dataclass(frozen=True)
class NgramDrafter:
    """Proposes ``num_tokens`` drafts by prompt lookup: the longest suffix of ``max_ngram`` down to ``min_ngram``
    tokens that occurred before, and the tokens that followed its latest earlier occurrence.

    Example:
        >>> NgramDrafter(num_tokens=3).propose([5, 6, 7, 8, 5, 6])
        [7, 8, 5]
        >>> NgramDrafter(num_tokens=2).propose([1, 2, 3])
        [3, 3]
    """

    num_tokens: int
    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self) -> None:
        check_num_tokens(self.num_tokens)
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram; got {self.min_ngram} and {self.max_ngram}")

    def propose_batch(self, requests: Sequence[Request]) -> list[list[int]]:
        """``propose`` for each request's tokens."""
        return [self.propose(request.token_ids) for request in requests]

    def release(self, request: Request) -> None:
        """Nothing to give back: the drafts come from the request's own text."""

    def propose(self, tokens: Sequence[int]) -> list[int]:
        """``num_tokens`` drafts to follow ``tokens`` (the last token repeated where no n-gram matches)."""
        found: list[int] = []
        for size in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            suffix = list(tokens[-size:])
            # The latest earlier occurrence: scan starts from the right, never the suffix itself.
            for start in range(len(tokens) - size - 1, -1, -1):
                if list(tokens[start : start + size]) == suffix:
                    found = list(tokens[start + size : start + size + self.num_tokens])
                    break
            if found:
                break
        filler = found[-1] if found else tokens[-1]
        return found + [filler] * (self.num_tokens - len(found))


@dataclass
class DraftModelDrafter:
    """Drafts with ``model_runner``'s model (smaller, same vocabulary) greedily, each request mirrored in its own KV
    cache: the mirror holds the target's tokens and the drafts after them, and after each verify step keeps the cache
    of the longest prefix the target still has (the accepted drafts), so only what changed is recomputed.

    The draft engine's graphs serve its steps: its extend steps (catching up, a row per request) replay its prefill
    graphs and its decode steps its decode graphs, as any engine's would (``model_runner.init_cuda_graphs()``).
    """

    model_runner: ModelRunner
    num_tokens: int
    mirrors: dict[Request, Request] = field(default_factory=dict)
    """Each target request's mirror in the draft engine (its row and KV slots there)."""

    def __post_init__(self) -> None:
        check_num_tokens(self.num_tokens)

    def check_target(self, target: ModelRunner) -> None:
        """Raise ``ValueError`` unless the draft model speaks the target's vocabulary."""
        draft_vocab, target_vocab = self.model_runner.model.config.vocab_size, target.model.config.vocab_size
        if draft_vocab != target_vocab:
            raise ValueError(
                f"the draft model's vocabulary has {draft_vocab} tokens and the target's {target_vocab}: a draft "
                "model must share the target's tokenizer"
            )

    def propose_batch(self, requests: Sequence[Request]) -> list[list[int]]:
        """One extend step over what each mirror's cache lacks, then ``num_tokens - 1`` decode steps; the greedy
        token of each step is the next draft."""
        mirrors = [self._synced_mirror(request) for request in requests]
        self._append_greedy(mirrors, self.model_runner.run(self.model_runner.extend_batch(mirrors)))
        for _ in range(self.num_tokens - 1):
            self._append_greedy(mirrors, self.model_runner.run(self.model_runner.decode_batch(mirrors)))
        return [mirror.output_ids[-self.num_tokens :] for mirror in mirrors]

    def release(self, request: Request) -> None:
        """Give back the mirror's row and KV slots in the draft engine."""
        mirror = self.mirrors.pop(request, None)
        if mirror is not None:
            self.model_runner.release(mirror)

    def _synced_mirror(self, request: Request) -> Request:
        mirror = self.mirrors.get(request)
        if mirror is None:
            mirror = Request(request.index, list(request.prompt_ids), request.params, lookahead=self.num_tokens)
            self.mirrors[request] = self.model_runner.hold(mirror)
        # Keep the cache of the longest prefix both still have: the target's tokens up to the first rejected draft.
        cached, tokens = mirror.token_ids[: mirror.cached_len], request.token_ids
        common = next((i for i, (a, b) in enumerate(zip(cached, tokens, strict=False)) if a != b), len(cached))
        mirror.cached_len = min(common, len(tokens) - 1)
        mirror.output_ids = list(request.output_ids)
        return mirror

    @staticmethod
    def _append_greedy(mirrors: list[Request], logits: torch.Tensor) -> None:
        tokens = logits.argmax(dim=-1).tolist()
        for mirror, token in zip(mirrors, tokens, strict=True):
            mirror.cached_len = len(mirror.token_ids)
            mirror.output_ids.append(token)


@dataclass
class EagleDrafter:
    """Drafts with an EAGLE head (``model_runner``, an ``EagleModelRunner`` beside the target), EAGLE-1 style: the
    head at position ``p`` reads the token there and the target's hidden state of position ``p - 1``.

    - After the target's prefill (``after_prefill``): a draft prefill over each prompt and the target's first token,
      eagerly (hidden state of position 0: zeros), whose last row seeds the first draft.
    - After each verify step (``after_verify``): a draft extend of ``k + 1`` rows a request (the accepted drafts and
      the target's token, padded), each reading the target's hidden state of the verify row before it, straight from
      the target's ``hidden_states_buffer`` on the device; its seed is the next round's first draft (one graph).
    - ``propose_batch``: the seed's token, then ``k - 1`` chained draft steps from it (one graph).

    The seeds stay on the device; ``propose_batch`` reads the ``k`` drafts to the host once (the verify batch is
    built there). The target must keep its hidden states (``ModelRunner(keep_hidden_states=k + 1)``).

    The head's keys and values go to the target's slots of the same positions, within the ``k`` slots a request
    reserves past its budget (``Request.lookahead``): a round whose last token is at position ``m`` writes the draft
    extend up to ``m + k`` and the chain up to ``m + k - 1``, and a request that finished gets no extend.
    """

    model_runner: EagleModelRunner
    seeds: dict[Request, tuple[DraftSeed, int]] = field(default_factory=dict)
    """Each running request's seed: a batch's ``DraftSeed`` and the request's row in it."""

    @property
    def num_tokens(self) -> int:
        """Drafts per request and step."""
        return self.model_runner.num_tokens

    def check_target(self, target: ModelRunner) -> None:
        """Raise ``ValueError`` unless ``target`` is the model runner the head drafts for, keeping its hidden
        states."""
        if target is not self.model_runner.target:
            raise ValueError("this EAGLE drafter's head was built for another target ModelRunner than this one")
        if target.hidden_states_buffer is None:
            raise ValueError(
                "an EAGLE drafter reads the target's hidden states: build the target ModelRunner with "
                f"keep_hidden_states={self.num_tokens + 1}"
            )

    def after_prefill(self, requests: Sequence[Request]) -> None:
        """Seed every request that goes on: a draft prefill over its prompt and first token."""
        runner = self.model_runner
        hidden = self._target_hidden()
        live, rows, start = [], [], 0
        for request in requests:
            size = len(request.prompt_ids)
            if not request.finished:
                live.append(request)
                rows += [-1, *range(start, start + size)]  # position 0 reads zeros (-1), position j row j - 1
            start += size
        if not live:
            return
        shadows = [
            Request(r.index, r.token_ids, r.params, req_pool_index=r.req_pool_index, kv_slots=r.kv_slots) for r in live
        ]
        batch = make_extend_batch(shadows, runner.device)
        padded = torch.cat((hidden.new_zeros((1, hidden.shape[1])), hidden[:start]))
        batch.hidden_states = padded.index_select(0, torch.tensor(rows, device=runner.device) + 1)
        self._keep(live, runner.draft_prefill(batch))

    def after_verify(self, requests: Sequence[Request], accepted: Sequence[int]) -> None:
        """Seed every request that goes on: a draft extend over the tokens the verify step gave it."""
        runner, query_len = self.model_runner, self.num_tokens + 1
        hidden = self._target_hidden()
        live: list[Request] = []
        tokens: list[list[int]] = []
        starts: list[int] = []
        lens: list[int] = []
        rows: list[int] = []
        for index, (request, kept) in enumerate(zip(requests, accepted, strict=True)):
            if request.finished:
                continue
            new = request.token_ids[-(kept + 1) :]
            live.append(request)
            tokens.append(new + [0] * (query_len - len(new)))  # padding rows: their KV the next steps overwrite
            starts.append(len(request.token_ids) - len(new))
            lens.append(len(new))
            rows += range(index * query_len, (index + 1) * query_len)
        if not live:
            return
        batch = make_rows_batch(ForwardMode.TARGET_VERIFY, live, tokens, starts, runner.device)
        batch.accepted_lens = torch.tensor(lens, dtype=torch.int64).to(runner.device)
        batch.hidden_states = hidden.index_select(0, torch.tensor(rows, device=runner.device))
        seed = runner.draft_extend(batch)
        self._keep(live, DraftSeed(seed.tokens.clone(), seed.hidden_states.clone()))  # a graph's output is reused

    def propose_batch(self, requests: Sequence[Request]) -> list[list[int]]:
        """Each request's seed token, then ``num_tokens - 1`` chained draft steps from it."""
        seed = self._seeds_of(requests)
        first = seed.tokens[:, None]
        if self.num_tokens == 1:
            return first.tolist()  # type: ignore[no-any-return]
        runner = self.model_runner
        starts = [len(request.token_ids) for request in requests]
        batch = make_rows_batch(ForwardMode.DECODE, list(requests), [[0]] * len(requests), starts, runner.device)
        batch.input_ids = seed.tokens
        batch.hidden_states = seed.hidden_states
        return torch.cat((first, runner.draft_steps(batch)), dim=1).tolist()  # type: ignore[no-any-return]

    def release(self, request: Request) -> None:
        """Forget ``request``'s seed (its KV slots are the target's: the target gives them back)."""
        self.seeds.pop(request, None)

    def _target_hidden(self) -> torch.Tensor:
        hidden = self.model_runner.target.hidden_states_buffer
        if hidden is None:
            raise ValueError("the target keeps no hidden states: build it with keep_hidden_states (check_target)")
        return hidden

    def _keep(self, requests: Sequence[Request], seed: DraftSeed) -> None:
        for row, request in enumerate(requests):
            self.seeds[request] = (seed, row)

    def _seeds_of(self, requests: Sequence[Request]) -> DraftSeed:
        """The requests' seeds as one batch: a kept batch as it is when it is exactly theirs, else gathered."""
        entries = []
        for request in requests:
            entry = self.seeds.get(request)
            if entry is None:
                raise RuntimeError(
                    f"request {request.index} has no EAGLE seed: the drafter seeds a request after the target's "
                    "prefill of it (the Scheduler calls after_prefill)"
                )
            entries.append(entry)
        source = entries[0][0]
        same = all(seed is source for seed, _ in entries) and source.tokens.shape[0] == len(entries)
        if same and all(row == index for index, (_, row) in enumerate(entries)):
            return source
        return DraftSeed(
            torch.cat([seed.tokens[row : row + 1] for seed, row in entries]),
            torch.cat([seed.hidden_states[row : row + 1] for seed, row in entries]),
        )


def accept_greedy(drafts: Sequence[int], target_tokens: Sequence[int]) -> list[int]:
    """The tokens a verify step adds: the drafts up to the first one the target disagrees with, then the target's
    token at that point (``target_tokens[i]`` is the target's argmax after the last token and ``drafts[:i]``).

    Example:
        >>> accept_greedy([7, 8, 9], [7, 8, 4, 1])
        [7, 8, 4]
        >>> accept_greedy([7, 8], [7, 8, 3])
        [7, 8, 3]
    """
    if len(target_tokens) != len(drafts) + 1:
        raise ValueError(f"{len(drafts)} drafts need {len(drafts) + 1} target tokens; got {len(target_tokens)}")
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == target_tokens[accepted]:
        accepted += 1
    return [*drafts[:accepted], target_tokens[accepted]]
