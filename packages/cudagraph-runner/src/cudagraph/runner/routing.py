"""Where a step goes: the one decision, whether a batch replays a graph (and which) or runs eagerly (and why).

A runner answers ``route(batch)`` with a ``Route``, looked up in a ``RouteTable`` built once after capture: one route
per size from 0 to the largest configured bucket (decode: batch size; prefill: token count), one for every larger
size and one for a forward mode the runner does not graph. A replay route names its bucket; an eager route names its
``EagerReason``. The same ``Route`` objects are shared by every size that goes the same way, so routing a step looks
up a list entry and allocates nothing.

A size's route is decided by ``SIZE_RULES``, first match wins:

===================  ===========================================================================================
``NOT_A_BUCKET``     no configured bucket holds the size (only with padding disabled: exact sizes only)
``OVER_BUDGET``      its bucket has no graph (the capture stopped at the memory budget, or ran out of memory)
``OVER_PADDED``      its bucket is more than ``max_padding_ratio`` times the size
===================  ===========================================================================================

Sizes above the largest configured bucket are ``TOO_LARGE``. Size 0 (an idle batch: nothing to compute, but a
graph replay keeps a tensor-parallel rank in step with the others) replays the bucket of size 1 and is never
over-padded. A size pads to the smallest bucket that holds it (``pad_to_bucket``, the config's one padding rule).
This module decides only; it never touches a device.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from cudagraph.config import (
    BUCKETS_OPTIONS,
    MAX_SIZE_OPTIONS,
    MEMORY_BUDGET_OPTIONS,
    PADDING_RATIO_OPTIONS,
    Phase,
    exceeds_padding_ratio,
    smallest_bucket_holding,
)


@dataclass(frozen=True)
class _ReasonInfo:
    text: str
    flags: Mapping[Phase, str] | None = None
    """For a size reason, the flag per phase that would give such batches a graph (``None``: not a size reason)."""
    action: str = "raise"


class EagerReason(enum.Enum):
    """Why a step runs eagerly. ``text`` says it in words; a size reason (the batch's size has no usable graph)
    also names, per phase, the flag that would capture such batches (``flag(phase)``, ``hint(phase)``)."""

    NOT_CAPTURED = "not_captured"
    EAGER_FALLBACK = "eager_fallback"
    PHASE_DISABLED = "phase_disabled"
    GRAPHS_UNAVAILABLE = "graphs_unavailable"
    MODE_NOT_GRAPHABLE = "mode_not_graphable"
    TOO_LARGE = "too_large"
    NOT_A_BUCKET = "not_a_bucket"
    OVER_BUDGET = "over_budget"
    OVER_PADDED = "over_padded"
    TOO_MANY_REQUESTS = "too_many_requests"
    QUERY_LEN_NOT_CAPTURED = "query_len_not_captured"
    ASLEEP = "asleep"

    @property
    def text(self) -> str:
        """What happened, in words."""
        return _REASONS[self].text

    @property
    def is_size_reason(self) -> bool:
        """Whether a flag could give such batches a graph (what the metrics' eager-share warning watches)."""
        return _REASONS[self].flags is not None

    def flag(self, phase: Phase | str) -> str | None:
        """The option that would capture batches sent eager for this reason in ``phase`` (``None``: no flag)."""
        flags = _REASONS[self].flags
        return flags[Phase(phase)] if flags is not None else None

    def hint(self, phase: Phase | str) -> str | None:
        """What to do about it, naming the flag (``"raise --decode-cuda-graph-max-bs"``), or ``None``."""
        flag = self.flag(phase)
        return f"{_REASONS[self].action} {flag}" if flag is not None else None


_REASONS: Mapping[EagerReason, _ReasonInfo] = MappingProxyType(
    {
        EagerReason.NOT_CAPTURED: _ReasonInfo("no graphs captured (before capture, or after shutdown)"),
        EagerReason.EAGER_FALLBACK: _ReasonInfo("the backend could not capture this model (eager fallback)"),
        EagerReason.PHASE_DISABLED: _ReasonInfo("CUDA graphs of this phase are disabled"),
        EagerReason.GRAPHS_UNAVAILABLE: _ReasonInfo("graphs off: CUDA graphs need a CUDA device"),
        EagerReason.MODE_NOT_GRAPHABLE: _ReasonInfo("a forward mode this phase's graphs do not run"),
        EagerReason.TOO_LARGE: _ReasonInfo("larger than the largest bucket", MAX_SIZE_OPTIONS),
        EagerReason.NOT_A_BUCKET: _ReasonInfo("not a captured size (padding disabled)", BUCKETS_OPTIONS, "add it to"),
        EagerReason.OVER_BUDGET: _ReasonInfo("its bucket has no graph (memory budget)", MEMORY_BUDGET_OPTIONS),
        EagerReason.OVER_PADDED: _ReasonInfo("its bucket pads over max_padding_ratio", PADDING_RATIO_OPTIONS),
        EagerReason.TOO_MANY_REQUESTS: _ReasonInfo("more requests than the graph has request rows"),
        EagerReason.QUERY_LEN_NOT_CAPTURED: _ReasonInfo(
            "a uniform step whose tokens per request no graph was captured for (a verify runner serves one length)"
        ),
        EagerReason.ASLEEP: _ReasonInfo("the runner is asleep (graphs and KV cache given back; refused)"),
    }
)


@dataclass(frozen=True)
class Route:
    """Where one step goes: ``bucket`` (the graph it replays) or ``None`` with the ``reason`` it runs eagerly.

    ``requests`` is the request rows of the bucket's graph (a prefill batch with more requests runs eagerly); 0 for
    an eager route. Routes come from a ``RouteTable`` and are shared: never build one per step.
    """

    bucket: int | None
    reason: EagerReason | None = None
    requests: int = 0

    @property
    def replays(self) -> bool:
        """Whether the step replays a graph."""
        return self.bucket is not None

    @staticmethod
    def eager(reason: EagerReason) -> Route:
        """The shared eager route of ``reason``."""
        return _EAGER_ROUTES[reason]


_EAGER_ROUTES: Mapping[EagerReason, Route] = MappingProxyType({reason: Route(None, reason) for reason in EagerReason})


@dataclass(frozen=True)
class SizeCase:
    """What the rules see of one size: its configured bucket (``None``: none holds it), the captured buckets and
    the padding limit."""

    size: int
    bucket: int | None
    captured: frozenset[int]
    max_padding_ratio: float | None

    @property
    def over_padded(self) -> bool:
        """The bucket is more than ``max_padding_ratio`` times the size (the config's ``exceeds_padding_ratio``); an
        idle batch, size 0, never is."""
        if self.size == 0 or self.bucket is None:
            return False
        return exceeds_padding_ratio(self.size, self.bucket, self.max_padding_ratio)


SIZE_RULES: tuple[tuple[EagerReason, Callable[[SizeCase], bool]], ...] = (
    (EagerReason.NOT_A_BUCKET, lambda case: case.bucket is None),
    (EagerReason.OVER_BUDGET, lambda case: case.bucket not in case.captured),
    (EagerReason.OVER_PADDED, lambda case: case.over_padded),
)
"""Why a size up to the largest configured bucket runs eagerly, in precedence order (first match wins)."""


def pad_to_bucket(buckets: Sequence[int], size: int) -> int | None:
    """The smallest bucket that holds ``size`` (``buckets`` ascending), or ``None`` when ``size`` exceeds them all
    (the config's one padding rule, ``smallest_bucket_holding``)."""
    return smallest_bucket_holding(buckets, size)


def padded_bucket(buckets: Sequence[int], size: int, *, disable_padding: bool = False) -> int | None:
    """The configured bucket a batch of ``size`` pads to: the smallest that holds it, or exactly ``size`` with
    ``disable_padding``; ``None`` when none does (``buckets`` ascending)."""
    if disable_padding:
        return size if size in buckets else None
    return pad_to_bucket(buckets, size)


@dataclass(frozen=True)
class RouteTable:
    """Every route a runner can answer: ``by_size[n]`` for sizes 0..largest bucket, ``beyond`` for larger sizes,
    ``wrong_mode`` for a forward mode the runner does not graph."""

    by_size: tuple[Route, ...]
    beyond: Route
    wrong_mode: Route

    @classmethod
    def closed(cls, reason: EagerReason) -> RouteTable:
        """Every step eager for ``reason`` (a runner before capture, after ``shutdown``, or fallen back)."""
        route = Route.eager(reason)
        return cls((), route, route)

    @classmethod
    def build(
        cls,
        buckets: Sequence[int],
        captured: Sequence[int],
        *,
        disable_padding: bool = False,
        max_padding_ratio: float | None = None,
        requests_of: Callable[[int], int] | None = None,
    ) -> RouteTable:
        """The routes of a runner configured for ``buckets`` (ascending) that holds graphs of ``captured``.

        A size pads to its ``padded_bucket`` and replays it unless a rule of ``SIZE_RULES`` sends it eagerly.
        ``requests_of(bucket)`` is a graph's request rows (default: the bucket, as in decode, one request per token).
        """
        if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
            raise ValueError(f"buckets must be ascending distinct positive sizes, got {list(buckets)}")
        captured_set = frozenset(captured)
        if not captured_set <= set(buckets):
            raise ValueError(f"captured buckets {sorted(captured_set)} are not all configured ({list(buckets)})")
        rows_of = requests_of or (lambda bucket: bucket)
        replay_routes = {bucket: Route(bucket, None, rows_of(bucket)) for bucket in sorted(captured_set)}
        by_size = []
        for size in range(buckets[-1] + 1):
            wanted = max(size, 1)  # an idle batch replays the bucket of one
            bucket = padded_bucket(buckets, wanted, disable_padding=disable_padding)
            case = SizeCase(size, bucket, captured_set, max_padding_ratio)
            reason = next((reason for reason, applies in SIZE_RULES if applies(case)), None)
            if reason is not None:
                by_size.append(Route.eager(reason))
            else:
                assert bucket is not None  # NOT_A_BUCKET would have matched
                by_size.append(replay_routes[bucket])
        return cls(tuple(by_size), Route.eager(EagerReason.TOO_LARGE), Route.eager(EagerReason.MODE_NOT_GRAPHABLE))

    def of_size(self, size: int) -> Route:
        """The route of a batch of ``size`` in a graphed mode."""
        return self.by_size[size] if size < len(self.by_size) else self.beyond
