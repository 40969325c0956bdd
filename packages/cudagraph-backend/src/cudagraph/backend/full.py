"""The full backend: the whole forward of one shape, attention metadata included, as one ``torch.cuda.CUDAGraph``.

With ``compile_max_shape`` (``--torch-compile-max-bs``, SGLang's flag), shapes up to it capture an inductor-compiled
model forward inside that one graph: the compiler's fused kernels replace the eager ones, and replay stays one
``CUDAGraph.replay()`` (no Python runs at replay, so no guard can fail there). Larger shapes capture the eager
forward.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from cudagraph.backend_utils import CaptureOptions, GraphPool, graph_replay_fn, use_compiled_model_forward
from cudagraph.config import Backend, Phase, read_torch_compile_mode

from .base import BaseCudaGraphBackend, GraphEntry, _nothing_to_replay
from .compile_forward import CompileStats, compile_model_forward, counting_inductor

logger = logging.getLogger(__name__)


class FullCudaGraphBackend(BaseCudaGraphBackend):
    """One graph per shape; replay is a single ``CUDAGraph.replay()``.

    The attention metadata is computed inside the graph (``captures_attn_metadata = True``), so the runner only
    copies inputs into static buffers before replaying.

    Args:
        compile_max_shape: shapes up to this one capture an inductor-compiled model forward (0: none). ``prepare``
            compiles the host model runner's ``model_forward`` once, on the largest such bucket, with the token
            dimension dynamic; a model that does not trace raises ``ModelTraceError``.
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
        phase: Phase | str | None = None,
        options: CaptureOptions | None = None,
        pool: GraphPool | None = None,
        share_global_pool: bool = True,
        compile_max_shape: int = 0,
        compile_mode: str | None = None,
    ) -> None:
        if compile_mode is not None:  # bad input fails on any machine, before the device check
            read_torch_compile_mode("compile_mode", compile_mode)
        super().__init__(device, phase=phase, options=options, pool=pool, share_global_pool=share_global_pool)
        if compile_max_shape < 0:
            raise ValueError(f"compile_max_shape must be 0 (off) or a positive shape, not {compile_max_shape}")
        self.compile_max_shape = compile_max_shape
        self.compile_mode = compile_mode
        self.compiled_forward: Callable[..., Any] | None = None
        """The compiled ``model_forward`` that shapes up to ``compile_max_shape`` capture (set by ``prepare``)."""
        if compile_max_shape:
            self.compile_stats = CompileStats()

    def prepare(self, runner: object) -> None:
        """With ``compile_max_shape``, compile the host model runner's ``model_forward`` on the largest bucket that
        uses it (once: a recapture reuses it)."""
        if not self.compile_max_shape or self.compiled_forward is not None:
            return
        assert self.compile_stats is not None
        model_runner = getattr(runner, "model_runner", None)
        eager_forward = getattr(model_runner, "model_forward", None)
        static_buckets = getattr(runner, "static_buckets", None) or {}
        compiled_shapes = [shape for shape in static_buckets if shape <= self.compile_max_shape]
        if eager_forward is None or not compiled_shapes:
            raise TypeError(
                "compiled small buckets need a runner with a static bucket up to "
                f"{self.compile_max_shape} whose model_runner has model_forward(input_ids, positions) -> hidden; got "
                f"{type(runner).__name__} with buckets {sorted(static_buckets)} and model runner "
                f"{type(model_runner).__name__}"
            )
        batch = static_buckets[max(compiled_shapes)].batch
        self.compiled_forward = compile_model_forward(
            eager_forward,
            lambda: model_runner.forward(batch),  # type: ignore[union-attr]
            (batch.input_ids, batch.positions),
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
