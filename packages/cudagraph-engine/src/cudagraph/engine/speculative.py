"""Greedy speculative decoding: draft tokens (by n-gram lookup or with a draft model), verify them in one target
step, keep what agrees.

1. A ``Drafter`` proposes each request's next ``num_tokens`` tokens, always exactly that many, so a verify step is
   uniform and replays one graph. ``NgramDrafter`` looks them up in the request's own text: the continuation of the
   latest earlier occurrence of its last few tokens (prompt lookup), padded by repeating the last one.
   ``DraftModelDrafter`` runs a smaller model of the same vocabulary greedily: one extend step over what its cache
   lacks (the tokens the last verify step accepted), then ``num_tokens - 1`` decode steps, each replaying the draft
   engine's own graphs (prefill's, then decode's).
2. The engine runs a verify step (``batch.make_verify_batch``): the last token and the drafts of every request,
   logits of every token.
3. ``accept_greedy`` keeps the drafts the target's argmax agrees with, up to the first disagreement, and adds the
   target's own token there: at least one new token a step, exactly the tokens plain greedy decoding would produce.

What it does not do: sampling with a temperature (rejection sampling), tree drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from .batch import Request

if TYPE_CHECKING:
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
