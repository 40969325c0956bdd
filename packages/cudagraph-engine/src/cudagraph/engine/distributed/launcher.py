"""Start N rank processes on this host, wait for them, and bring them all down when one fails.

``launch(worker, payload, world_size)`` spawns one process per rank (``spawn`` start method: CUDA-safe), each
calling ``worker(rank, world_size, init_method, payload)``; rank 0's return value comes back. The parent watches
every process: when one exits with an error, the others are stopped (terminated, then killed after a grace period)
and one ``RankFailedError`` names the rank and its error. A rank never waits forever on a dead peer (the process
group's timeouts), and the parent never waits forever on a stuck rank after the others finished (``exit_timeout_s``).

Under ``torchrun`` nothing is spawned here: each process is already a rank (``torchrun_rank`` reads which).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import queue
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .environment import disable_multicast

Worker = Callable[[int, int, str, Any], Any]
"""``worker(rank, world_size, init_method, payload) -> result`` (module-level, so ``spawn`` can pickle it)."""

GRACE_S = 5.0
"""How long a stopped rank gets to exit after ``terminate`` before it is killed."""

POLL_S = 0.2


class RankFailedError(RuntimeError):
    """A rank of a tensor-parallel group failed (an error, a signal, or no exit); the others were stopped."""


@dataclass(frozen=True)
class RankOutcome:
    """What a rank reported before exiting: its pickled result (rank 0) or its error in one line plus the
    traceback."""

    rank: int
    result: Any = None
    error: str | None = None
    traceback: str | None = None


@dataclass(frozen=True)
class TorchrunRank:
    """This process's place in a ``torchrun`` launch."""

    rank: int
    local_rank: int
    world_size: int


def torchrun_rank(environ: dict[str, str] | None = None) -> TorchrunRank | None:
    """The rank ``torchrun`` started this process as, or ``None`` when it was not started by ``torchrun``."""
    env = dict(os.environ if environ is None else environ)
    if not all(name in env for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return None
    return TorchrunRank(int(env["RANK"]), int(env.get("LOCAL_RANK", env["RANK"])), int(env["WORLD_SIZE"]))


def free_tcp_init_method(host: str = "127.0.0.1") -> str:
    """A ``tcp://`` rendezvous address on a port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return f"tcp://{host}:{probe.getsockname()[1]}"


def _rank_main(worker: Worker, rank: int, world_size: int, init_method: str, payload: Any, outcomes: Any) -> None:
    disable_multicast()
    try:
        result = worker(rank, world_size, init_method, payload)
    except BaseException as error:
        details = traceback.format_exc()
        print(f"[tp-rank-{rank}] {details}", file=sys.stderr, flush=True)
        outcomes.put(RankOutcome(rank, error=f"{type(error).__name__}: {error}", traceback=details))
        raise SystemExit(1) from None
    # Pickled here with the plain pickler: torch's queue reducers would share tensors through file descriptors that
    # die with this process before the parent reads them.
    outcomes.put(RankOutcome(rank, result=pickle.dumps(result) if rank == 0 else None))


def launch(
    worker: Worker, payload: Any, world_size: int, *, exit_timeout_s: float = 60.0, init_method: str | None = None
) -> Any:
    """Run ``worker`` on ``world_size`` spawned ranks; rank 0's result, or ``RankFailedError`` once any rank fails
    (the others stopped). ``exit_timeout_s``: how long ranks may take to exit after the first one finished."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    disable_multicast()  # spawned children inherit this environment
    context = multiprocessing.get_context("spawn")
    outcomes = context.Queue()
    address = init_method or free_tcp_init_method()
    processes = [
        context.Process(
            target=_rank_main, args=(worker, rank, world_size, address, payload, outcomes), name=f"tp-rank-{rank}"
        )
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    reported: dict[int, RankOutcome] = {}
    try:
        _watch(processes, outcomes, reported, exit_timeout_s)
    finally:
        _stop(processes)
    return pickle.loads(reported[0].result)


def _drain(outcomes: Any, reported: dict[int, RankOutcome], wait_s: float = 0.0) -> None:
    while True:
        try:
            outcome = outcomes.get(timeout=wait_s) if wait_s else outcomes.get_nowait()
        except queue.Empty:
            return
        reported[outcome.rank] = outcome
        wait_s = 0.0


def _watch(processes: list[Any], outcomes: Any, reported: dict[int, RankOutcome], exit_timeout_s: float) -> None:
    """Wait until every rank exited cleanly; raise ``RankFailedError`` at the first one that did not."""
    first_exit_deadline: float | None = None
    clock = time.monotonic
    while any(process.exitcode is None for process in processes):
        multiprocessing.connection.wait([p.sentinel for p in processes if p.exitcode is None], timeout=POLL_S)
        _drain(outcomes, reported)
        failed = [p for p in processes if p.exitcode not in (None, 0)]
        if failed:
            rank = processes.index(failed[0])
            _drain(outcomes, reported, wait_s=1.0)  # its report may still be in flight
            raise RankFailedError(_failure_message(rank, failed[0].exitcode, reported.get(rank), len(processes)))
        if first_exit_deadline is None and any(p.exitcode == 0 for p in processes):
            first_exit_deadline = clock() + exit_timeout_s
        if first_exit_deadline is not None and clock() > first_exit_deadline:
            stuck = [processes.index(p) for p in processes if p.exitcode is None]
            raise RankFailedError(
                f"tensor-parallel ranks {stuck} did not exit within {exit_timeout_s:g} s after the others finished; "
                "they were stopped"
            )
    _drain(outcomes, reported, wait_s=1.0)
    if 0 not in reported:
        raise RankFailedError("tensor-parallel rank 0 exited without reporting a result")


def _failure_message(rank: int, exitcode: int | None, outcome: RankOutcome | None, world_size: int) -> str:
    if outcome is not None and outcome.error is not None:
        cause = outcome.error
    elif exitcode is not None and exitcode < 0:
        cause = f"killed by signal {-exitcode}"
    else:
        cause = f"exited with status {exitcode} without reporting an error"
    others = world_size - 1
    return f"tensor-parallel rank {rank} failed: {cause}; stopped the other {others} rank{'s' * (others != 1)}"


def _stop(processes: list[Any]) -> None:
    """Terminate what still runs, kill what ignores it, and reap everything."""
    for process in processes:
        if process.exitcode is None:
            process.terminate()
    for process in processes:
        process.join(GRACE_S)
        if process.exitcode is None:
            process.kill()
            process.join(GRACE_S)
