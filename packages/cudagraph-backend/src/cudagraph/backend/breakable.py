"""The breakable backend: each shape is graph segments with the registered break ops (attention) run eagerly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cudagraph.backend_utils import BreakableCUDAGraph, GraphPool
from cudagraph.config import Backend

from .base import BaseCudaGraphBackend, GraphEntry


class BreakableCudaGraphBackend(BaseCudaGraphBackend):
    """Capture with ``BreakableCUDAGraph``: calls of registered break ops end a segment and run eagerly.

    At capture the op runs once on the capture stream; at replay it runs again with the same tensor arguments (the
    runner's static buffers and the pool intermediates), reading whatever per-step state the caller stored for it.
    The attention metadata is therefore computed outside the graph, before every replay
    (``captures_attn_metadata = False``).

    The breakable switches (``split_every_op``, ``barrier``) come with the other capture options.
    """

    backend = Backend.BREAKABLE
    captures_attn_metadata = False

    def _capture(
        self, shape: int, forward_fn: Callable[[], Any], stream: torch.cuda.Stream, pool: GraphPool
    ) -> GraphEntry:
        graph = BreakableCUDAGraph(pool=pool, options=self.options)
        with graph.capture(stream):
            output = forward_fn()
        return GraphEntry(shape=shape, graph=graph, replay=graph.replay, output=output)
