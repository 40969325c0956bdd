"""SGLang's monolithic decode graph runner module, faked on the CPU: a "graph" replays the function it captured."""

import contextlib
import gc

_IS_CAPTURE_MODE = False
_GLOBAL_GRAPH_MEMORY_POOL = None


def get_is_capture_mode():
    return _IS_CAPTURE_MODE


@contextlib.contextmanager
def model_capture_mode():
    global _IS_CAPTURE_MODE
    _IS_CAPTURE_MODE = True
    try:
        yield
    finally:
        _IS_CAPTURE_MODE = False


@contextlib.contextmanager
def freeze_gc(enable_cudagraph_gc: bool):
    gc.collect()
    should_freeze = not enable_cudagraph_gc
    if should_freeze:
        gc.freeze()
    try:
        yield
    finally:
        if should_freeze:
            gc.unfreeze()


def get_batch_sizes_to_capture(model_runner, num_tokens_per_bs=1):
    capture_bs = list(model_runner.server_args.cuda_graph_bs or [1, 2, 4])
    return capture_bs, capture_bs


def get_global_graph_memory_pool():
    return _GLOBAL_GRAPH_MEMORY_POOL


def set_global_graph_memory_pool(val):
    global _GLOBAL_GRAPH_MEMORY_POOL
    _GLOBAL_GRAPH_MEMORY_POOL = val


class CudaGraphRunner:
    """Captures one "graph" per batch size and replays it."""

    def __init__(
        self, model_runner, *, attn_backend=None, speculative_num_steps=None, speculative_num_draft_tokens=None
    ):
        self.model_runner = model_runner
        self.capture_bs, self.compile_bs = get_batch_sizes_to_capture(model_runner)
        self.graphs = {}
        self.output_buffers = {}

    def _create_device_graph(self):
        return {"replays": 0}

    def _capture_graph(self, graph, pool, stream, run_once_fn):
        graph["run"] = run_once_fn
        return run_once_fn()

    def capture_one_batch_size(self, bs, forward, stream_idx=None):
        graph = self._create_device_graph()
        output = self._capture_graph(graph, get_global_graph_memory_pool(), None, lambda: forward(bs))
        return graph, output

    def capture(self):
        with model_capture_mode():
            for bs in reversed(self.capture_bs):
                graph, output = self.capture_one_batch_size(bs, self.model_runner.forward)
                self.graphs[bs] = graph
                self.output_buffers[bs] = output

    def can_run(self, batch_size):
        return batch_size in self.graphs

    def replay(self, batch_size):
        graph = self.graphs[batch_size]
        graph["replays"] += 1
        return graph["run"]()
