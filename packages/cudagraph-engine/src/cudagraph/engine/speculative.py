"""Greedy speculative decoding: draft tokens by n-gram lookup, verify them in one target step, keep what agrees.

1. ``NgramDrafter.propose`` guesses each request's next ``num_tokens`` tokens from its own text: the continuation of
   the latest earlier occurrence of its last few tokens (prompt lookup). Every request always gets exactly
   ``num_tokens`` drafts (padded by repeating the last one), so a verify step is uniform and replays one graph.
2. The engine runs a verify step (``batch.make_verify_batch``): the last token and the drafts of every request,
   logits of every token.
3. ``accept_greedy`` keeps the drafts the target's argmax agrees with, up to the first disagreement, and adds the
   target's own token there: at least one new token a step, exactly the tokens plain greedy decoding would produce.

What it does not do: sampling with a temperature (rejection sampling), tree drafts, a draft model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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
        if self.num_tokens < 1:
            raise ValueError(f"num_tokens={self.num_tokens}: a speculative step drafts at least one token")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram; got {self.min_ngram} and {self.max_ngram}")

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
