"""The breakable backend: each shape is graph segments with the registered break ops (attention) run eagerly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cudagraph.backend_utils import BreakableCUDAGraph
from cudagraph.config import Backend, Phase

from .base import BaseCudaGraphBackend, GraphEntry


class BreakableCudaGraphBackend(BaseCudaGraphBackend):
    """Capture with ``BreakableCUDAGraph``: calls of registered break ops end a segment and run eagerly.

    At capture the op runs once on the capture stream; at replay it runs again with the same tensor arguments (the
    runner's static buffers and the pool intermediates), reading whatever per-step state the caller stored for it.
    The attention metadata is therefore computed outside the graph, before every replay
    (``captures_attn_metadata = False``).

    Extra options: ``split_every_op`` (one op per segment, for bisecting capture bugs) and ``barrier`` (called
    before each eager break while capturing).
    """

    backend = Backend.BREAKABLE
    captures_attn_metadata = False

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        *,
        phase: Phase | str | None = None,
        split_every_op: bool = False,
        barrier: Callable[[], None] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(device, phase=phase, **options)
        self.split_every_op = split_every_op
        self.barrier = barrier

    def _capture(self, shape: int, forward_fn: Callable[[], Any], stream: torch.cuda.Stream) -> GraphEntry:
        graph = BreakableCUDAGraph(
            pool=self.ensure_pool(),
            debug=self.debug,
            split_every_op=self.split_every_op,
            barrier=self.barrier,
            capture_error_mode=self.capture_error_mode,
        )
        with graph.capture(stream):
            output = forward_fn()
        return GraphEntry(shape=shape, graph=graph, replay=graph.replay, output=output)
