"""The platform's decode graph runner: SGLang's runner with the platform's graphs, capture and cache locations."""

import torch
from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner

from npu_plugin.npu import NPUGraph


class NPUGraphRunner(CudaGraphRunner):
    """Runs the decode forward pass from platform graphs."""

    def _create_device_graph(self):
        return NPUGraph()

    def _capture_graph(self, graph, pool, stream, run_once_fn):
        # the platform captures with its inputs dispatched automatically, so replays need no input update
        graph.capture(run_once_fn, pool=pool, stream=stream, auto_dispatch_capture=True)
        return run_once_fn()

    def _cache_loc_dtype(self):
        # the platform's attention kernels take 32-bit cache locations
        return torch.int32

    def capture_one_batch_size(self, bs, forward, stream_idx=None):
        graph, output = super().capture_one_batch_size(bs, forward, stream_idx)
        graph.spec_info = self.get_spec_info(bs * self.num_tokens_per_bs)
        return graph, output

    def replay(self, forward_batch, pp_proxy_tensors=None):
        self.recapture_if_needed(forward_batch)
        return super().replay(forward_batch, pp_proxy_tensors)

    def captured_batch_sizes(self):
        """The batch sizes that have a platform graph."""
        return [bs for bs in self.capture_bs if isinstance(self.graphs.get(bs), NPUGraph)]
