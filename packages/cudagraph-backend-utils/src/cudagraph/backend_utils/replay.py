"""Replay callables bound once, for loops that run every step: the less Python between two launches, the better.

``torch.cuda.CUDAGraph.replay`` is a Python method that checks an optional input-liveness tracker and then calls the
C++ replay. A graph captured without that tracker (every graph this workspace captures) has nothing to check, so its
replay can be bound straight to the C++ method; a graph with a tracker keeps the checked method.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch


def graph_replay_fn(graph: torch.cuda.CUDAGraph) -> Callable[[], None]:
    """A zero-argument callable that replays ``graph``, bound now (no Python frame of torch's per replay when the
    graph has no input-liveness tracker to check). Bind it after the capture has ended."""
    if getattr(graph, "_tracker", None) is not None:
        return graph.replay
    native_replay = getattr(torch._C._CUDAGraph, "replay", None)
    if native_replay is None or not isinstance(graph, torch._C._CUDAGraph):
        return graph.replay
    return functools.partial(native_replay, graph)
