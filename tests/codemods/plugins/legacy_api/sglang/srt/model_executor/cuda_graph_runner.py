"""SGLang's monolithic decode graph runner module (stand-in), faked on the CPU.

A device graph here remembers the function captured into it and replay calls it again. Inputs go through static
buffers as in SGLang: replay copies the batch into them, pads it to a captured batch size and slices the output, so a
replay sees each new batch exactly as a real graph would. The module helpers keep SGLang's names and signatures.
"""

import bisect
import contextlib
import gc
from collections.abc import Callable

import torch

from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch

# Whether the current forward pass is being captured (SGLang keeps it in a module global too)
is_capture_mode = False

# One memory pool shared by every graph runner of the process
global_graph_memory_pool = None


def get_is_capture_mode():
    """Whether a graph is being captured now."""
    return is_capture_mode


@contextlib.contextmanager
def model_capture_mode():
    """Mark the block as a capture, so model code avoids host synchronisation."""
    global is_capture_mode
    is_capture_mode = True
    try:
        yield
    finally:
        is_capture_mode = False


@contextlib.contextmanager
def freeze_gc(enable_cudagraph_gc: bool):
    """Collect, then freeze surviving objects for the block unless ``enable_cudagraph_gc``."""
    gc.collect()
    should_freeze = not enable_cudagraph_gc
    if should_freeze:
        gc.freeze()
    try:
        yield
    finally:
        if should_freeze:
            gc.unfreeze()
            gc.collect()


def get_batch_sizes_to_capture(model_runner, num_tokens_per_bs=1):
    """The batch sizes to capture and those to compile, from the model runner's server arguments."""
    capture_bs = sorted(set(model_runner.server_args.cuda_graph_bs))
    compile_bs = []  # torch.compile is not part of the stand-in
    return capture_bs, compile_bs


def get_global_graph_memory_pool():
    """The memory pool graph runners share (``None`` before the first capture)."""
    return global_graph_memory_pool


def set_global_graph_memory_pool(val):
    """Share ``val`` as the graph memory pool of the process."""
    global global_graph_memory_pool
    global_graph_memory_pool = val


class _DeviceGraph:
    """What ``torch.cuda.CUDAGraph`` is to SGLang, on the CPU: replay calls again what was captured."""

    def __init__(self):
        self.run_once_fn = None
        self.pool = None
        self.replays = 0

    def replay(self):
        self.replays += 1
        return self.run_once_fn()


class CudaGraphRunner:
    """Runs the decode forward pass of a model from captured graphs, one per batch size; captures on construction."""

    def __init__(
        self,
        model_runner,
        *,
        attn_backend=None,
        speculative_num_steps: int | None = None,
        speculative_num_draft_tokens: int | None = None,
    ):
        self.model_runner = model_runner
        self.device = model_runner.device
        self.device_module = torch.get_device_module(self.device)
        self.graphs = {}
        self.output_buffers = {}
        self.disable_padding = model_runner.server_args.disable_cuda_graph_padding
        self.attn_backend = attn_backend
        self.speculative_num_steps = speculative_num_steps
        self.speculative_num_draft_tokens = speculative_num_draft_tokens
        self.capture_hidden_mode = CaptureHiddenMode.NULL
        self.num_tokens_per_bs = speculative_num_draft_tokens or 1
        self.capture_bs, self.compile_bs = get_batch_sizes_to_capture(model_runner, self.num_tokens_per_bs)
        self.max_bs = max(self.capture_bs)
        self.max_num_token = self.max_bs * self.num_tokens_per_bs
        self.input_ids = torch.zeros(self.max_num_token, dtype=torch.int64)
        self.out_cache_loc = torch.zeros(self.max_num_token, dtype=self._cache_loc_dtype())
        self.stream = None
        self.raw_bs = self.bs = 0
        with model_capture_mode():
            self.capture()

    def _cache_loc_dtype(self):
        return torch.int64

    def can_run(self, forward_batch: ForwardBatch):
        """Whether a captured graph can run this batch (padded up to a captured size unless padding is off)."""
        if self.disable_padding:
            return forward_batch.batch_size in self.graphs
        return forward_batch.batch_size <= self.max_bs

    def capture(self) -> None:
        """Capture every batch size, the largest first (smaller ones reuse its pool)."""
        with freeze_gc(self.model_runner.server_args.enable_cudagraph_gc):
            for bs in reversed(self.capture_bs):
                graph, output_buffers = self.capture_one_batch_size(bs, self.model_runner.model.forward)
                self.graphs[bs] = graph
                self.output_buffers[bs] = output_buffers

    def _capture_graph(self, graph, pool, stream, run_once_fn):
        graph.run_once_fn = run_once_fn
        graph.pool = pool
        return run_once_fn()

    def _create_device_graph(self):
        return _DeviceGraph()

    def capture_one_batch_size(self, bs: int, forward: Callable, stream_idx: int | None = None):
        """Capture one batch size: warm up, then capture ``forward`` on the static buffers."""
        graph = self._create_device_graph()
        num_tokens = bs * self.num_tokens_per_bs
        input_ids = self.input_ids[:num_tokens]

        def run_once():
            return forward(input_ids)

        for _ in range(2):  # SGLang warms up twice before capturing
            run_once()
        out = self._capture_graph(graph, get_global_graph_memory_pool(), self.stream, run_once)
        return graph, out

    def recapture_if_needed(self, forward_batch: ForwardBatch):
        """Capture again when the batch needs more hidden states than the graphs return."""
        required = max(
            forward_batch.capture_hidden_mode,
            getattr(forward_batch.spec_info, "capture_hidden_mode", None) or CaptureHiddenMode.NULL,
        )
        if self.capture_hidden_mode != required:
            self.capture_hidden_mode = required
            self.capture()

    def replay_prepare(self, forward_batch: ForwardBatch, pp_proxy_tensors=None):
        """Copy the batch into the static buffers, padded to the next captured batch size."""
        self.recapture_if_needed(forward_batch)
        raw_bs = forward_batch.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        self.input_ids[:raw_bs].copy_(forward_batch.input_ids)
        self.input_ids[raw_bs:bs].zero_()
        self.raw_bs, self.bs = raw_bs, bs

    def replay(self, forward_batch: ForwardBatch, pp_proxy_tensors=None):
        """Run the batch on its graph; the output is sliced back to the batch's own size."""
        self.replay_prepare(forward_batch, pp_proxy_tensors)
        output = self.graphs[self.bs].replay()
        return output[: self.raw_bs]

    def get_spec_info(self, num_tokens: int):
        """The speculative-decoding input a verify graph is captured with (``None`` without speculation)."""
        if self.model_runner.spec_algorithm is None:
            return None
        return {"algorithm": self.model_runner.spec_algorithm, "num_tokens": num_tokens}
