"""The full backend: the whole forward of one shape, attention metadata included, as one ``torch.cuda.CUDAGraph``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cudagraph.backend_utils import GraphPool, graph_replay_fn
from cudagraph.config import Backend

from .base import BaseCudaGraphBackend, GraphEntry, _nothing_to_replay


class FullCudaGraphBackend(BaseCudaGraphBackend):
    """One graph per shape; replay is a single ``CUDAGraph.replay()``.

    The attention metadata is computed inside the graph (``captures_attn_metadata = True``), so the runner only
    copies inputs into static buffers before replaying.
    """

    backend = Backend.FULL
    captures_attn_metadata = True

    def _capture(
        self, shape: int, forward_fn: Callable[[], Any], stream: torch.cuda.Stream, pool: GraphPool
    ) -> GraphEntry:
        graph, output = pool.capture(forward_fn, stream=stream, capture_error_mode=self.options.capture_error_mode)
        replay = graph_replay_fn(graph) if graph is not None else _nothing_to_replay
        return GraphEntry(shape=shape, graph=graph, replay=replay, output=output)
