"""Capture decisions the ranks of a tensor-parallel group make once and share.

Graphs of a sharded model hold its collectives, so every rank must capture the same buckets, or one rank replays a
graph (and its all-reduces) while another runs the step eagerly or not at all, and the collectives wait forever. What
could differ between ranks is memory: a budget that is a share of free memory, an estimate that came out larger on
one rank, an out-of-memory on one of them. So each such decision is shared before it is acted on: the planned
buckets are the ones every rank planned, a bucket is captured only where it fits on every rank, a graph is released
on every rank when one rank is over its budget, and a capture that ran out of memory on one rank is dropped on all.

The group is reached through the runner's ``capture_barrier``: an engine whose barrier is also a ``RankAgreement``
(it can take the minimum of a few integers over the group) gets these decisions shared; any other barrier, or none,
is one rank, deciding alone. What it does not do: agree on eager warm-ups. A rank that runs out of memory inside a
forward leaves the others waiting in that forward's collective until the group's timeout turns it into an error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from .memory_plan import CapturePlan

Agree = Callable[[Sequence[int]], list[int]]
"""``agree(values)``: the element-wise minimum of every rank's ``values`` (same length on every rank)."""

ANOTHER_RANK_LEFT_IT_OUT = "another rank's capture plan leaves it out (the ranks capture the same buckets)"
ANOTHER_RANK_HAS_NO_ROOM = "another rank's memory budget has no room for it (the ranks capture the same buckets)"
ANOTHER_RANK_RAN_OUT = "another rank ran out of CUDA memory capturing it (the ranks capture the same buckets)"
ANOTHER_RANK_RELEASED = "released because another rank went over its memory budget (the ranks keep the same buckets)"


@runtime_checkable
class RankAgreement(Protocol):
    """A tensor-parallel group's host-side handle at capture: the barrier the ranks meet at (``__call__``), which can
    also take the element-wise minimum of a few integers over every rank (``agree_min``)."""

    def __call__(self) -> None:
        """Wait until every rank arrives."""
        ...

    def agree_min(self, values: Sequence[int]) -> list[int]:
        """The element-wise minimum of ``values`` over every rank."""
        ...


def one_rank(values: Sequence[int]) -> list[int]:
    """The agreement of a group of one: its own values."""
    return list(values)


def agreement_of(barrier: object) -> Agree:
    """How a runner whose ``capture_barrier`` is ``barrier`` shares its decisions: the group's ``agree_min`` when the
    barrier is a ``RankAgreement``, else ``one_rank``."""
    return barrier.agree_min if isinstance(barrier, RankAgreement) else one_rank


def everywhere(agree: Agree, holds: bool) -> bool:
    """Whether ``holds`` is true on every rank."""
    return bool(agree([int(holds)])[0])


def agreed_plan(plan: CapturePlan, buckets: Sequence[int], agree: Agree) -> CapturePlan:
    """``plan`` cut to the buckets every rank planned; a bucket only another rank left out says so."""
    planned = agree([int(bucket in plan.buckets) for bucket in buckets])
    common = tuple(bucket for bucket, everyone in zip(buckets, planned, strict=True) if everyone)
    if common == tuple(plan.buckets):
        return plan
    skipped = dict(plan.skipped)
    skipped.update({bucket: ANOTHER_RANK_LEFT_IT_OUT for bucket in plan.buckets if bucket not in common})
    return dataclasses.replace(plan, buckets=common, skipped=dict(sorted(skipped.items())))
