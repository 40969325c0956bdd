"""The full backend: the whole forward of one shape, attention metadata included, as one ``torch.cuda.CUDAGraph``.

With ``compile_max_shape`` (``--torch-compile-max-bs``, SGLang's flag), shapes up to it capture an inductor-compiled
model forward inside that one graph: the compiler's fused kernels replace the eager ones, and replay stays one
``CUDAGraph.replay()`` (no Python runs at replay, so no guard can fail there). Larger shapes capture the eager
forward.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from cudagraph.backend_utils import GraphPool, graph_replay_fn, use_compiled_model_forward
from cudagraph.config import Backend, read_torch_compile_mode

from .base import BackendArgs, BaseCudaGraphBackend, GraphEntry, _nothing_to_replay
from .compile_forward import CompileStats, compile_model_forward, counting_inductor
from .entry_inputs import EntryInputs, entry_to_trace

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger(__name__)


class FullCudaGraphBackend(BaseCudaGraphBackend):
    """One graph per shape; replay is a single ``CUDAGraph.replay()``.

    The attention metadata is computed inside the graph (``captures_attn_metadata = True``), so the runner only
    copies inputs into static buffers before replaying.

    Args:
        compile_max_shape: shapes up to this one capture an inductor-compiled model forward (0: none). ``prepare``
            compiles the forward it is given once, on the largest such entry, with the token dimension dynamic; a
            model that does not trace raises ``ModelTraceError``.
        compile_mode: ``torch.compile`` mode of that compilation, one of ``cudagraph.config.TORCH_COMPILE_MODES``
            (``--torch-compile-mode``; ``None``: inductor's defaults; ``"max-autotune-no-cudagraphs"`` tunes Triton
            matmuls against cuBLAS, slower to compile). Any other mode is a ``ConfigError``.
        The other arguments are ``BaseCudaGraphBackend``'s.
    """

    backend = Backend.FULL
    captures_attn_metadata = True

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        *,
        compile_max_shape: int = 0,
        compile_mode: str | None = None,
        **common: Unpack[BackendArgs],
    ) -> None:
        if compile_mode is not None:  # bad input fails on any machine, before the device check
            read_torch_compile_mode("compile_mode", compile_mode)
        super().__init__(device, **common)
        if compile_max_shape < 0:
            raise ValueError(f"compile_max_shape must be 0 (off) or a positive shape, not {compile_max_shape}")
        self.compile_max_shape = compile_max_shape
        self.compile_mode = compile_mode
        self.compiled_forward: Callable[..., Any] | None = None
        """The compiled ``model_forward`` that shapes up to ``compile_max_shape`` capture (set by ``prepare``)."""
        if compile_max_shape:
            self.compile_stats = CompileStats()

    def prepare(self, model_forward: Callable[..., Any] | None, entries: Mapping[int, EntryInputs]) -> None:
        """The base's, then with ``compile_max_shape``: compile ``model_forward`` on the largest entry that uses it
        (once: a recapture reuses it)."""
        super().prepare(model_forward, entries)
        if not self.compile_max_shape or self.compiled_forward is not None:
            return
        assert self.compile_stats is not None
        forward, entry = entry_to_trace("compiled small buckets", model_forward, entries, self.compile_max_shape)
        self.compiled_forward = compile_model_forward(
            forward,
            entry.run_step,
            entry.token_inputs,
            counting_inductor(self.compile_stats, self.compile_mode),
            self.compile_stats,
        )
        logger.info(
            "full: shapes up to %d capture the inductor-compiled forward (mode %s), %s",
            self.compile_max_shape,
            self.compile_mode or "default",
            self.compile_stats.summary(),
        )

    def _forward_for_shape(self, shape: int, forward_fn: Callable[[], Any]) -> Callable[[], Any]:
        compiled = self.compiled_forward
        if compiled is None or shape > self.compile_max_shape:
            return forward_fn

        def compiled_step() -> Any:
            with use_compiled_model_forward(compiled):
                return forward_fn()

        return compiled_step

    def _capture(
        self, shape: int, forward_fn: Callable[[], Any], stream: torch.cuda.Stream, pool: GraphPool
    ) -> GraphEntry:
        graph, output = pool.capture(forward_fn, stream=stream, capture_error_mode=self.options.capture_error_mode)
        replay = graph_replay_fn(graph) if graph is not None else _nothing_to_replay
        return GraphEntry(shape=shape, graph=graph, replay=replay, output=output)
