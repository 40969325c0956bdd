"""SGLang's model runner (stand-in): the CUDA-graph part only, with a toy model."""

import torch

from sglang.srt import platforms
from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.piecewise_cuda_graph_runner import PiecewiseCudaGraphRunner


class _ToyModel(torch.nn.Module):
    """Doubles each token id: enough to tell which inputs a forward pass saw."""

    def forward(self, input_ids):
        return input_ids * 2


class ModelRunner:
    """Runs the model; owns the decode graph runner (``graph_runner``) and the prefill one."""

    def __init__(self, server_args, model=None):
        self.server_args = server_args
        self.device = "cpu"
        self.model = model if model is not None else _ToyModel()
        self.spec_algorithm = server_args.speculative_algorithm
        self.is_draft_worker = False
        self.graph_runner = None
        self.piecewise_cuda_graph_runner = None

    def initialize(self):
        """Build what runs the model: SGLang calls the graph hooks here, after loading weights."""
        self.init_device_graphs()
        self.init_piecewise_cuda_graphs()

    def init_device_graphs(self):
        """Capture device graphs."""
        self.graph_runner = None
        if self.server_args.disable_cuda_graph:
            return
        if platforms.current_platform.is_out_of_tree():
            graph_runner_cls = platforms.current_platform.get_graph_runner_cls()
            self.graph_runner = graph_runner_cls(self)
        else:
            self.graph_runner = CudaGraphRunner(self)

    def init_piecewise_cuda_graphs(self, force_for_draft_worker: bool = False):
        """Initialize piecewise CUDA graph runner."""
        self.piecewise_cuda_graph_runner = None
        if self.server_args.disable_piecewise_cuda_graph:
            return
        self.piecewise_cuda_graph_runner = PiecewiseCudaGraphRunner(self)

    def forward_decode(self, forward_batch: ForwardBatch):
        """One decode step: from a graph where one can run it, else eagerly."""
        if self.graph_runner is not None and self.graph_runner.can_run(forward_batch):
            return self.graph_runner.replay(forward_batch)
        return self.model.forward(forward_batch.input_ids)
