"""A runner's graphs across an engine's life: asleep and awake, and captured again when what they read moved.

States and the calls that move between them (``TRANSITIONS``; any other call is one ``RunnerStateError``):

=========  ==========================  ==================================================================
state      how it is reached            steps
=========  ==========================  ==================================================================
awake      built, ``wake()`` succeeded  replay their graphs (or capture them first, under ``lazy``)
asleep     ``sleep()``                  refused: one ``RunnerAsleepError`` (the KV cache is gone too)
waking     inside ``wake()``            (none: ``wake`` returns in ``awake`` or ``failed``)
failed     ``wake()`` could not capture run eagerly; ``eager_reason`` says why; ``sleep()`` and ``wake()``
                                        may try again
=========  ==========================  ==================================================================

``sleep(keep_graphs=True)`` keeps every graph: the engine gives their memory back through the allocator of
``cudagraph.backend_utils.sleep_memory``, which maps it again at the same addresses at wake, so ``wake()`` only
reopens the routes (buckets captured lazily stay captured; those not captured yet stay pending). It is taken only
where the graphs live in a pool that outlives a sleep (``graphs_kept_reason``); elsewhere the sleep releases them and
says why in one line.

``sleep()`` releases every graph and the pool they live in and forgets their address records
(``StaticBuckets.release_all``); the static buffers stay (small, and the graphs captured at wake read them at the
same addresses). ``wake()`` makes fresh static batches over the same buffers and captures again through
``capture()``: every planned bucket under the ``eager`` policy, none under ``lazy`` (each is captured by its next
first step). ``refresh_graphs()`` releases and captures the same way without the sleep, for graphs whose weights
moved.

The runner makes these moves (``BaseCudaGraphRunner.sleep``, ``wake``, ``refresh_graphs``) over its
``StaticBuckets``; this module holds the states and the one rule of which call may move which state.

Nothing here touches the engine's KV cache: the engine gives it back before the runners sleep and re-allocates it
before they wake (``cudagraph.engine.model_runner.ModelRunner.sleep``).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from .capture import RunnerCapture
from .graph_inputs import moved_error

logger = logging.getLogger(__name__)


class RunnerState(str, enum.Enum):
    """Where a runner is in its life (see the module docstring)."""

    AWAKE = "awake"
    ASLEEP = "asleep"
    WAKING = "waking"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


TRANSITIONS: Mapping[tuple[RunnerState, str], RunnerState] = MappingProxyType(
    {
        (RunnerState.AWAKE, "sleep"): RunnerState.ASLEEP,
        (RunnerState.FAILED, "sleep"): RunnerState.ASLEEP,
        (RunnerState.ASLEEP, "wake"): RunnerState.WAKING,
        (RunnerState.FAILED, "wake"): RunnerState.WAKING,
    }
)
"""(state, call) -> the state the call moves to; a pair not here is refused."""


class RunnerStateError(RuntimeError):
    """A lifecycle call made in a state that does not allow it (``sleep`` while asleep, ``wake`` while awake)."""


class RunnerAsleepError(RuntimeError):
    """A step reached a runner that is asleep: its graphs and the engine's KV cache were given back; ``wake()``
    first."""


def next_state(state: RunnerState, phase: object, call: str) -> RunnerState:
    """The state ``call`` moves a ``phase`` runner in ``state`` to, or one ``RunnerStateError`` naming the state and
    what is allowed."""
    target = TRANSITIONS.get((state, call))
    if target is None:
        allowed = sorted(name for (source, name) in TRANSITIONS if source is state)
        raise RunnerStateError(
            f"{phase} runner: {call}() while {state}; allowed now: {', '.join(allowed) or 'nothing'}"
        )
    return target


class RunnerLifecycle(RunnerCapture):
    """Sleep, wake and recapture of ``BaseCudaGraphRunner`` (a mixin of that one class, over its capture half): the
    moves of the table above, made over the runner's ``StaticBuckets``."""

    if TYPE_CHECKING:  # what it reads and calls of the runner, besides what ``RunnerCapture`` declares
        state: RunnerState
        wake_failure: str | None
        graphs_kept: bool

        def _index_buckets(self) -> None: ...
        def _close_routes(self) -> None: ...

    def _release_graphs(self) -> None:
        """Every graph and its pool released (the static buffers stay); nothing captured or pending."""
        self.static_buckets.release_all()
        self._lazy = None
        self.captured, self.captured_buckets, self.skipped_buckets = False, (), {}

    def _capture_again(self) -> None:
        """Fresh static buckets over the same static buffers, then ``capture()`` (every bucket, or none if lazy)."""
        self._index_buckets()
        self.capture()

    def graphs_kept_reason(self) -> str | None:
        """Why this runner's graphs cannot outlive a sleep (one line), or ``None`` when they can: their pool is one
        whose memory a sleep unmaps and a wake maps back at the same addresses (or nothing is captured yet)."""
        if self.backend.graphs_outlive_sleep:
            return None
        return "its graphs live in a pool of the caching allocator, which a sleep frees (no sleepable memory)"

    def sleep(self, *, keep_graphs: bool = False) -> bool:
        """Refuse steps until ``wake()``; release every graph and the pool they live in (the static buffers stay),
        or with ``keep_graphs`` keep them where their memory outlives the sleep. Returns whether they were kept."""
        self.state = next_state(self.state, self.phase, "sleep")
        reason = self.graphs_kept_reason() if keep_graphs else None
        self.graphs_kept = keep_graphs and reason is None
        if not self.graphs_kept:
            self._release_graphs()
        self._close_routes()
        if self.graphs_kept:
            logger.info("%s runner asleep: %d graphs kept for the wake", self.phase, len(self.captured_buckets))
        elif reason is not None:
            logger.info("%s runner asleep: graphs released and captured again at wake: %s", self.phase, reason)
        else:
            logger.info("%s runner asleep: graphs and their pool released", self.phase)
        return self.graphs_kept

    def wake(self) -> RunnerState:
        """Reopen the routes of graphs kept across the sleep, or capture again over the same static buffers (every
        planned bucket, or none under the lazy policy). A failure leaves the runner running eagerly,
        ``eager_reason`` saying why (state ``failed``)."""
        self.state = next_state(self.state, self.phase, "wake")
        if self.graphs_kept:
            self.graphs_kept = False
            self.state = RunnerState.AWAKE
            self._open_routes()
            logger.info("%s runner awake: %d graphs kept, none captured again", self.phase, len(self.captured_buckets))
            return self.state
        if self.wake_failure is not None:
            self.eager_reason = self.wake_failure = None
        try:
            self._capture_again()
        except Exception as error:  # any failure: nothing half-captured stays, and the runner still runs
            self._release_graphs()
            self.eager_reason = self.wake_failure = f"wake() could not capture the graphs again: {error}"
            logger.warning("%s CUDA graphs are off after a failed wake, every step runs eagerly: %s", self.phase, error)
        self.state = RunnerState.AWAKE if self.eager_reason is None else RunnerState.FAILED
        if self.state is RunnerState.FAILED:
            self._close_routes()
        return self.state

    def refresh_graphs(self, *, on_moved: str = "recapture") -> tuple[int, ...]:
        """Check that every graph's weights and caches are where it was captured to read them; recapture the stale
        buckets' graphs (all of them: they share their record), or refuse with one ``GraphInputsMovedError``
        (``on_moved="raise"``). Returns the stale buckets. Not per step: a copy into the same memory moves nothing."""
        if on_moved not in ("recapture", "raise"):
            raise ValueError(f"on_moved={on_moved!r}: allowed: 'recapture', 'raise'")
        stale = self.graph_inputs.stale()
        if not stale:
            return ()
        if on_moved == "raise":
            raise moved_error(self.phase, stale)
        logger.info("%s CUDA graphs of %d buckets read moved tensors: capturing again", self.phase, len(stale))
        self._release_graphs()
        self._capture_again()
        return tuple(sorted(stale))
