"""A speculative-decoding draft runner, written like SGLang's EAGLE draft runner: its own class (not a subclass of
the decode runner) built on the legacy runner module's helpers, sharing the target model's graph memory pool."""

import itertools

import torch
from sglang.srt.model_executor.cuda_graph_runner import (
    freeze_gc,
    get_batch_sizes_to_capture,
    get_global_graph_memory_pool,
    get_is_capture_mode,
    model_capture_mode,
    set_global_graph_memory_pool,
)

_pool_ids = itertools.count(1)


class _DraftGraph:
    """What ``torch.cuda.CUDAGraph`` is on the device, faked on the CPU: it replays what it captured."""

    def __init__(self):
        self.run_once_fn = None
        self.pool_handle = None

    def capture(self, run_once_fn, pool=None):
        self.run_once_fn = run_once_fn
        self.pool_handle = pool if pool is not None else (0, next(_pool_ids))

    def pool(self):
        return self.pool_handle

    def replay(self):
        return self.run_once_fn()


class EAGLEDraftCudaGraphRunner:
    """Captures the draft model's multi-step forward per batch size; shares the graph pool of the process."""

    def __init__(self, model_runner, topk=2):
        self.model_runner = model_runner
        self.topk = topk
        self.graphs = {}
        self.output_buffers = {}
        self.capture_bs, self.compile_bs = get_batch_sizes_to_capture(model_runner)
        self.max_bs = max(self.capture_bs)
        self.input_ids = torch.zeros(self.max_bs * topk, dtype=torch.int64)
        self.capture_log = []
        self.capture()

    def capture(self):
        with freeze_gc(self.model_runner.server_args.enable_cudagraph_gc), model_capture_mode():
            for bs in reversed(self.capture_bs):
                graph, output_buffers = self.capture_one_batch_size(bs)
                self.graphs[bs] = graph
                self.output_buffers[bs] = output_buffers

    def _capture_graph(self, graph, pool, stream, run_once_fn):
        graph.capture(run_once_fn, pool=pool)
        return run_once_fn()

    def capture_one_batch_size(self, num_seqs, forward=None):
        graph = _DraftGraph()
        input_ids = self.input_ids[: num_seqs * self.topk]

        def run_once():
            # model code checks the capture mode to skip host synchronisation while capturing
            self.capture_log.append(get_is_capture_mode())
            return self.model_runner.model.forward(input_ids)

        out = self._capture_graph(graph, get_global_graph_memory_pool(), None, run_once)
        set_global_graph_memory_pool(graph.pool())
        return graph, out

    def replay(self, input_ids):
        """Draft tokens for ``input_ids`` (``topk`` per request) from the graph of the next captured batch size."""
        num_seqs = len(input_ids) // self.topk
        bs = min(size for size in self.capture_bs if size >= num_seqs)
        self.input_ids[: len(input_ids)].copy_(input_ids)
        return self.graphs[bs].replay()[: len(input_ids)]

    def graph_pools(self):
        """The memory pools the captured graphs use."""
        return {graph.pool() for graph in self.graphs.values()}
