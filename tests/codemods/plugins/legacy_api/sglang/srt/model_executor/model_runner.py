"""SGLang's model runner (the CUDA-graph part only)."""

from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner


class ModelRunner:
    """Runs the model; owns the decode graph runner."""

    def __init__(self, server_args):
        self.server_args = server_args
        self.graph_runner = None

    def forward(self, batch_size):
        return [float(batch_size)] * batch_size

    def init_device_graphs(self):
        if self.server_args.disable_cuda_graph:
            return
        self.graph_runner = CudaGraphRunner(self)
        self.graph_runner.capture()
