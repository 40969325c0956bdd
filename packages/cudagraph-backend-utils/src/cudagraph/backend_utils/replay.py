"""Replay callables bound once, for loops that run every step: the less Python between two launches, the better.

``torch.cuda.CUDAGraph.replay`` is a Python method around the C++ replay. In the torch releases listed in
``CHECKED_REPLAY_TORCH_VERSIONS`` its body is one of ``CHECKED_REPLAY_SOURCES``: call the C++ replay, after checking
an optional input-liveness tracker (2.13). For a graph with no tracker that body adds nothing, so its replay is bound
straight to the C++ method (``torch._C._CUDAGraph.replay``), a private name. Newer torch does more in Python
(instantiates a graph on demand, runs replay hooks, records replay streams), which the bound call would skip. So the
bind is taken only where the Python replay can add nothing, and decided once per graph when it is bound
(``native_replay_refusal``):

- the replay method the graph's class runs is the C++ one or has exactly the checked body (another body, a new torch
  or a subclass's override, keeps the public method);
- the graph has no input-liveness tracker and no replay hook registered;
- the graph is not waiting to be instantiated on its first replay.

Otherwise the callable is the public ``graph.replay``. A hook registered after binding is not seen: bind after every
hook is in place (the backends bind right after capture and register none).
"""

from __future__ import annotations

import functools
import inspect
import textwrap
from collections.abc import Callable

import torch

__all__ = [
    "CHECKED_REPLAY_SOURCE",
    "CHECKED_REPLAY_SOURCES",
    "CHECKED_REPLAY_TORCH_VERSIONS",
    "PLAIN_REPLAY_SOURCE",
    "graph_replay_fn",
    "native_replay_refusal",
]

CHECKED_REPLAY_SOURCE = '''def replay(self) -> None:
    r"""Replay the CUDA work captured by this graph."""
    if self._tracker is not None:
        self._tracker.check_alive(self.pool())
    super().replay()
'''
"""The body of ``torch.cuda.CUDAGraph.replay`` (dedented source) that the bind was checked against: with no tracker
it is the C++ replay and nothing else."""

PLAIN_REPLAY_SOURCE = '''def replay(self) -> None:
    r"""Replay the CUDA work captured by this graph."""
    super().replay()
'''
"""The body of ``torch.cuda.CUDAGraph.replay`` in torch releases without the liveness tracker (2.11, read on the GPU
machine's build): the C++ replay and nothing else."""

CHECKED_REPLAY_SOURCES: tuple[str, ...] = (CHECKED_REPLAY_SOURCE, PLAIN_REPLAY_SOURCE)
"""Every replay body the bind was checked against: for a graph with no tracker, each is the C++ replay alone."""

CHECKED_REPLAY_TORCH_VERSIONS: tuple[str, ...] = ("2.11.0", "2.13.0")
"""The torch releases whose ``CUDAGraph.replay`` was read and found to be one of ``CHECKED_REPLAY_SOURCES``."""

_REPLAY_HOOK_ATTRIBUTES: tuple[str, ...] = ("_replay_start_hooks", "_replay_end_hooks")
"""Per-graph hook tables that newer torch runs around every replay (empty when none is registered)."""


def _native_replay() -> Callable[[torch.cuda.CUDAGraph], None] | None:
    return getattr(torch._C._CUDAGraph, "replay", None)


@functools.cache
def _replay_body_refusal(replay: object) -> str | None:
    """Why the bind may not stand in for the replay method ``replay`` (``None``: it may); decided once per method."""
    if replay is _native_replay():
        return None  # the class runs the C++ replay itself: nothing in Python to skip
    try:
        source = textwrap.dedent(inspect.getsource(replay))  # type: ignore[arg-type]
    except (OSError, TypeError):
        return "its replay method has no Python source to check"
    if source not in CHECKED_REPLAY_SOURCES:
        return (
            f"its replay method ({getattr(replay, '__qualname__', replay)!s}, torch {torch.__version__}) is not the "
            f"one the bind was checked against (torch {', '.join(CHECKED_REPLAY_TORCH_VERSIONS)})"
        )
    return None


def native_replay_refusal(graph: torch.cuda.CUDAGraph) -> str | None:
    """Why ``graph`` keeps torch's public ``replay`` instead of the bound C++ call, or ``None`` when the Python replay
    would add nothing to the C++ call for it (see the module docstring for the conditions)."""
    if _native_replay() is None or not isinstance(graph, torch._C._CUDAGraph):
        return "it is not a torch C++ graph"
    body_refusal = _replay_body_refusal(type(graph).replay)
    if body_refusal is not None:
        return body_refusal
    if getattr(graph, "_tracker", None) is not None:
        return "it checks its inputs' liveness on every replay"
    if any(getattr(graph, name, None) for name in _REPLAY_HOOK_ATTRIBUTES):
        return "it has replay hooks registered"
    if getattr(graph, "_has_graph_exec", True) is False:
        return "it is instantiated on its first replay"
    return None


def graph_replay_fn(graph: torch.cuda.CUDAGraph) -> Callable[[], None]:
    """A zero-argument callable that replays ``graph``, bound now: the C++ replay itself (no Python frame of torch's
    per replay) where ``native_replay_refusal`` finds nothing the Python replay would add, else ``graph.replay``. Bind
    it after the capture has ended and any hooks are registered."""
    if native_replay_refusal(graph) is not None:
        return graph.replay
    native_replay = _native_replay()
    assert native_replay is not None  # native_replay_refusal refuses when torch has none
    return functools.partial(native_replay, graph)
