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
reopens the routes the runner had (buckets captured lazily stay captured; those not captured yet stay pending). It is
taken only where the graphs live in a pool that outlives a sleep (``graphs_kept_reason``); elsewhere the sleep
releases them and says why in one line.

``sleep()`` releases every graph and the pool they live in (``backend.cleanup``) and forgets their address records;
the static buffers stay (small, and the graphs captured at wake read them at the same addresses). ``wake()`` makes
fresh static batches over the same buffers and captures again through ``capture()``: every planned bucket under the
``eager`` policy, none under ``lazy`` (each is captured by its next first step). ``recapture()`` is the same
release-and-capture without the sleep, for graphs whose weights moved (``refresh_graphs``).

Nothing here touches the engine's KV cache: the engine gives it back before the runners sleep and re-allocates it
before they wake (``cudagraph.engine.model_runner.ModelRunner.sleep``).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the runner calls this module, never the other way round at import
    from .base import BaseCudaGraphRunner

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


def next_state(runner: BaseCudaGraphRunner, call: str) -> RunnerState:
    """The state ``call`` moves ``runner`` to, or one ``RunnerStateError`` naming the state and what is allowed."""
    state = runner.state
    target = TRANSITIONS.get((state, call))
    if target is None:
        allowed = sorted(name for (source, name) in TRANSITIONS if source is state)
        raise RunnerStateError(
            f"{runner.phase} runner: {call}() while {state}; allowed now: {', '.join(allowed) or 'nothing'}"
        )
    return target


def release_graphs(runner: BaseCudaGraphRunner) -> None:
    """Free every graph of ``runner`` and its pool, forget their bindings and address records, and route every step
    eagerly; the static buffers stay."""
    runner.backend.cleanup()
    for static_bucket in runner.static_buckets.values():
        static_bucket.release()
    runner.graph_inputs.clear()
    runner._lazy = None
    runner._pending = set()
    runner.captured = False
    runner.captured_buckets = ()
    runner.skipped_buckets = {}


def graphs_kept_reason(runner: BaseCudaGraphRunner) -> str | None:
    """Why ``runner``'s graphs cannot outlive a sleep (one line), or ``None`` when they can: their pool is one whose
    memory a sleep unmaps and a wake maps back at the same addresses (or nothing is captured into any pool yet)."""
    if runner.backend.graphs_outlive_sleep:
        return None
    return "its graphs live in a pool of the caching allocator, which a sleep frees (no sleepable memory)"


def sleep(runner: BaseCudaGraphRunner, *, keep_graphs: bool = False) -> bool:
    """Put ``runner`` to sleep (see the module docstring): its graphs kept when ``keep_graphs`` and their pool allows
    it, else released; steps are refused until ``wake``. Returns whether the graphs were kept."""
    runner.state = next_state(runner, "sleep")
    reason = graphs_kept_reason(runner) if keep_graphs else None
    if keep_graphs and reason is None:
        runner.routes_kept = runner.routes
        runner._close_routes()
        logger.info("%s runner asleep: %d graphs kept for the wake", runner.phase, len(runner.captured_buckets))
        return True
    runner.routes_kept = None
    release_graphs(runner)
    runner._close_routes()
    if reason is not None:
        logger.info("%s runner asleep: graphs released and captured again at wake: %s", runner.phase, reason)
    else:
        logger.info("%s runner asleep: graphs and their pool released", runner.phase)
    return False


def capture_again(runner: BaseCudaGraphRunner) -> None:
    """Fresh static batches over the same buffers, then ``capture()`` (every bucket, or none under ``lazy``)."""
    runner._index_static_buckets(runner.model_runner.attn_backend)
    runner.capture()


def wake(runner: BaseCudaGraphRunner) -> RunnerState:
    """Capture ``runner``'s graphs again after ``sleep`` (see the module docstring); its state after: ``awake``, or
    ``failed`` (everything released, every step eager, ``eager_reason`` saying why) when capturing raised."""
    runner.state = next_state(runner, "wake")
    kept, runner.routes_kept = runner.routes_kept, None
    if kept is not None:
        runner._set_routes(kept)
        runner.state = RunnerState.AWAKE
        logger.info("%s runner awake: %d graphs kept, none captured again", runner.phase, len(runner.captured_buckets))
        return runner.state
    if runner.wake_failure is not None:
        runner.eager_reason = runner.wake_failure = None
    try:
        capture_again(runner)
    except Exception as error:  # any failure: nothing half-captured stays, and the runner still runs
        release_graphs(runner)
        runner.eager_reason = runner.wake_failure = f"wake() could not capture the graphs again: {error}"
        runner._close_routes()
        runner.state = RunnerState.FAILED
        logger.warning("%s CUDA graphs are off after a failed wake, every step runs eagerly: %s", runner.phase, error)
        return runner.state
    runner.state = RunnerState.AWAKE if runner.eager_reason is None else RunnerState.FAILED
    return runner.state


def recapture(runner: BaseCudaGraphRunner) -> None:
    """Release every graph of an awake ``runner`` and capture again over the same static buffers."""
    release_graphs(runner)
    capture_again(runner)
