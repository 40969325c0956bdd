"""Step sources: for one configuration, turn rotating batches of one shape into a step function (logits of a batch).

One class per kind of configuration: the eager forward, our runners, a raw ``torch.cuda.CUDAGraph`` of the forward
(the floor), our breakable primitive and the peers captured around the same forward, and
``torch.compile(mode="reduce-overhead")`` of the traceable model forward. Graph-style sources capture on the first
batch of a shape and replay it; a source frees everything it captured in ``close()``.

The attention metadata of a graph-style step (raw, primitive, peers, torch.compile) lives in the attention
backend's static graph state: the capture hook points it at the shape once, the replay hook refreshes it before
every step, exactly what our runners do, so every configuration runs the same attention kernels.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from cudagraph.backend import ops_of_namespace, register_inductor_fallbacks
from cudagraph.backend_utils import (
    ForwardContext,
    breakable_capture,
    model_capture_mode,
    new_graph_pool,
    set_forward_context,
)
from cudagraph.config import ConfigError, CudaGraphConfig
from cudagraph.engine.kernels import LayerKernels
from cudagraph.engine.model_runner import ModelRunner
from cudagraph.runner import DecodeCudaGraphRunner, ForwardBatch, PrefillCudaGraphRunner, ReplayMetadata

from .peers import Peer
from .workload import StepFn

ENGINE_OP_NAMESPACES = ("cudagraph_engine", "cudagraph_triton")
"""The custom-op namespaces of the reference engine (attention, all-reduce; the Triton kernel set's operations)."""


class SourceUnavailableError(RuntimeError):
    """This configuration cannot run here (the config rejects it, a runner fell back to eager...): skip the row."""


class StepSource(abc.ABC):
    """Makes the step function of one configuration for one shape."""

    def __init__(self, model_runner: ModelRunner) -> None:
        self.model_runner = model_runner
        self._engine_kernels: LayerKernels | None = None

    def _switch_kernels(self, kernels: LayerKernels) -> None:
        """Run the engine on ``kernels`` until ``_restore_kernels`` (the set the engine would pick for this
        configuration, where it differs from the eager engine's)."""
        if self._engine_kernels is None:
            self._engine_kernels = self.model_runner.kernels
        self.model_runner.use_kernels(kernels)

    def _restore_kernels(self) -> None:
        """Give the engine back the kernels it had before ``_switch_kernels`` (nothing if they were not switched)."""
        if self._engine_kernels is not None:
            self.model_runner.use_kernels(self._engine_kernels)
            self._engine_kernels = None

    @abc.abstractmethod
    def step_for(self, batches: list[ForwardBatch]) -> StepFn:
        """The step of this configuration for the shape of ``batches`` (all the same shape)."""

    def close(self) -> None:  # noqa: B027 (most sources hold something; the eager one holds nothing)
        """Free what this source captured or compiled."""


class EagerSource(StepSource):
    """The engine's eager forward."""

    def step_for(self, batches: list[ForwardBatch]) -> StepFn:
        """``ModelRunner.forward``."""
        return self.model_runner.forward


class RunnerSource(StepSource):
    """One of our runners (decode or prefill), built from ``config`` and captured for every shape up front."""

    def __init__(self, model_runner: ModelRunner, config: CudaGraphConfig, prefill: bool) -> None:
        super().__init__(model_runner)
        try:
            model_runner.check_graph_config(config)
        except ConfigError as error:
            raise SourceUnavailableError(f"the engine refuses it: {error}") from None
        # The kernels the engine would run with this config (never FlashInfer's where it compiles the forward).
        self._switch_kernels(model_runner.kernels_for(config))
        runner_type = PrefillCudaGraphRunner if prefill else DecodeCudaGraphRunner
        try:
            self.runner: DecodeCudaGraphRunner | PrefillCudaGraphRunner = runner_type(
                model_runner, config, show_progress=False
            )
        except BaseException:
            self._restore_kernels()
            raise
        try:
            self.stats = self.runner.capture()
        except BaseException:
            self.close()
            raise
        if self.runner.eager_reason is not None:
            raise SourceUnavailableError(f"the runner fell back to eager: {self.runner.eager_reason}")

    def step_for(self, batches: list[ForwardBatch]) -> StepFn:
        """``runner.replay`` (a batch it cannot take would run eagerly: refused instead)."""
        if not self.runner.can_run(batches[0]):
            raise SourceUnavailableError(f"{self.runner!r} cannot run this batch")
        return self.runner.replay

    def close(self) -> None:
        """Shut the runner down and drop dynamo's compiled code: every configuration compiles ``model_forward`` (the
        same code object) afresh, so cache entries of earlier ones must not count towards its recompile limit."""
        self.runner.shutdown()
        self._restore_kernels()
        torch._dynamo.reset()


def prepare_graph_metadata(model_runner: ModelRunner, batch: ForwardBatch) -> None:
    """Point the attention backend's static graph state at ``batch``'s shape (the capture hook)."""
    backend = model_runner.attn_backend
    requests, tokens = batch.batch_size, batch.num_tokens
    backend.init_cuda_graph_state(max(requests, tokens), tokens)
    extra: dict[str, Any] = {"forward_batch": batch} if batch.forward_mode.is_extend() else {}
    backend.init_forward_metadata_capture_cuda_graph(
        requests, tokens, batch.req_pool_indices, batch.seq_lens, batch.forward_mode, **extra
    )


def refresh_graph_metadata(model_runner: ModelRunner, batch: ForwardBatch) -> None:
    """Refresh the static attention state for ``batch`` before a replay (the replay hook, one ``ReplayMetadata``)."""
    model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(ReplayMetadata.of_batch(batch))


def warm_up(model_runner: ModelRunner, batch: ForwardBatch, runs: int = 2) -> None:
    """Run the forward eagerly on a side stream (lazy initialization, cuBLAS workspaces) before a capture."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(runs):
            model_runner.forward(batch)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()


def load_inputs(static: ForwardBatch, batch: ForwardBatch) -> None:
    """Copy every tensor field of ``batch`` into ``static``'s (what a user of a bare graph must do per step)."""
    for field in dataclasses.fields(static):
        target, source = getattr(static, field.name), getattr(batch, field.name)
        if isinstance(target, torch.Tensor) and source is not target:
            target.copy_(source, non_blocking=True)


class CapturedSource(StepSource):
    """A graph-style source: capture the forward of each shape's first batch, replay it for any batch of that shape.

    Subclasses say how to capture (``capture``); replay copies the batch in, refreshes the attention state, sets the
    forward context (the eager breaks read it) and replays.
    """

    copies_inputs = True
    """Whether a step copies its batch into the captured one (the raw floor does not)."""

    def __init__(self, model_runner: ModelRunner) -> None:
        super().__init__(model_runner)
        self.graphs: list[Any] = []

    @abc.abstractmethod
    def capture(self, forward: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
        """Capture ``forward`` (eager breaks at the split ops, or none); the replayable object and its output."""

    def capture_shape(self, static: ForwardBatch) -> tuple[Any, torch.Tensor]:
        """Capture the forward of ``static`` (after pointing the attention state at it and warming up); the
        replayable object, kept until ``close()``, and its static output."""
        model_runner = self.model_runner
        with model_capture_mode():
            prepare_graph_metadata(model_runner, static)
            warm_up(model_runner, static)
            graph, output = self.capture(lambda: model_runner.forward(static))
        self.graphs.append(graph)
        return graph, output

    def step_for(self, batches: list[ForwardBatch]) -> StepFn:
        """Capture on ``batches[0]``; the step replays it with the given batch's inputs copied in."""
        model_runner, static = self.model_runner, batches[0]
        graph, output = self.capture_shape(static)
        context = ForwardContext(forward_batch=static, attn_backend=model_runner.attn_backend, extra={})
        replay = graph.replay
        copies_inputs = self.copies_inputs

        def step(batch: ForwardBatch) -> torch.Tensor:
            if copies_inputs:
                load_inputs(static, batch)
            refresh_graph_metadata(model_runner, static)
            with set_forward_context(context):
                replay()
            return output

        return step

    def close(self) -> None:
        """Reset every captured graph."""
        for graph in self.graphs:
            graph.reset()
        self.graphs.clear()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


class RawGraphSource(CapturedSource):
    """One ``torch.cuda.CUDAGraph`` of the whole forward, replayed on its own inputs: no copies, no hooks, no
    context. The floor any runner is measured against."""

    copies_inputs = False

    def capture(self, forward: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
        """``torch.cuda.graph`` around the forward."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            output = forward()
        return graph, output

    def step_for(self, batches: list[ForwardBatch]) -> StepFn:
        """Replay only (the graph reads the first batch's tensors whatever batch is passed).

        An attention backend that plans on the host (FlashInfer) shares one index workspace between all of its
        wrappers, so any other plan in between (another source, an eager step) rewrites what this graph reads: its
        plan for the captured batch is made again before each replay, as every runner does.
        """
        static = batches[0]
        graph, output = self.capture_shape(static)
        replay = graph.replay
        model_runner = self.model_runner
        plans_on_host = bool(getattr(model_runner.attn_backend, "needs_seq_lens_cpu", False))

        def step(batch: ForwardBatch) -> torch.Tensor:
            if plans_on_host:
                refresh_graph_metadata(model_runner, static)
            replay()
            return output

        return step


class PrimitiveSource(CapturedSource):
    """Our breakable primitive (``BreakableCUDAGraph``) around the forward: it breaks at the split ops itself."""

    def capture(self, forward: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
        """``breakable_capture`` around the forward."""
        with breakable_capture(pool=new_graph_pool()) as graph:
            output = forward()
        return graph, output


class PeerSource(CapturedSource):
    """A PyPI peer around the forward, breaking at the same split ops."""

    def __init__(self, model_runner: ModelRunner, peer: Peer) -> None:
        super().__init__(model_runner)
        self.peer = peer

    def capture(self, forward: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
        """The peer's capture context around the forward."""
        graph = self.peer.new_graph()
        with self.peer.capture(graph):
            output = forward()
        return graph, output


class TorchCompileSource(StepSource):
    """``torch.compile(mode="reduce-overhead")`` of the traceable model forward (``ModelRunner.model_forward``),
    the engine's forward otherwise unchanged; inductor's cudagraph trees record and replay per shape.

    The attention metadata is kept in the static graph state (refreshed per step, as for every graph here), so the
    graphs it records read the same addresses at every replay. The attention and KV-store ops read the batch from
    the forward context when they are recorded; the rotating batches share their KV slots, so replaying what was
    recorded is correct here, the best case for this configuration.
    """

    def __init__(self, model_runner: ModelRunner) -> None:
        super().__init__(model_runner)
        self._switch_kernels(model_runner.traced_kernels())
        # The engine's custom ops get inductor's fallback up front, as the engine's own compiles do: torch 2.11's
        # implicit fallback stringifies every input's IR history, minutes on a whole forward of the Triton set.
        register_inductor_fallbacks(op for namespace in ENGINE_OP_NAMESPACES for op in ops_of_namespace(namespace))
        self.compiled = torch.compile(model_runner.model_forward, mode="reduce-overhead")
        model_runner.model_forward = self.compiled  # type: ignore[method-assign]  # forward() calls self.model_forward

    def step_for(self, batches: list[ForwardBatch]) -> StepFn:
        """Compiled steps of this shape (recorded on the first calls, during warm-up)."""
        model_runner = self.model_runner
        prepare_graph_metadata(model_runner, batches[0])
        mark_step = torch.compiler.cudagraph_mark_step_begin

        def step(batch: ForwardBatch) -> torch.Tensor:
            mark_step()
            refresh_graph_metadata(model_runner, batch)
            with model_capture_mode():
                return model_runner.forward(batch)

        return step

    def close(self) -> None:
        """Restore the eager model forward and drop the compiled code and its graphs."""
        del self.model_runner.model_forward
        self._restore_kernels()
        torch._dynamo.reset()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
