"""This engine's model runner: ``graph_runner`` and ``init_device_graphs`` are its own names, as SGLang's were."""

from tiny_llm.graphs import CudaGraphRunner


class ModelRunner:
    def __init__(self, cuda_graph_max_bs, disable_cuda_graph=False):
        self.cuda_graph_max_bs = cuda_graph_max_bs
        self.disable_cuda_graph = disable_cuda_graph
        self.graph_runner = None
        self.init_device_graphs()

    def init_device_graphs(self):
        if self.disable_cuda_graph:
            return
        sizes = [bs for bs in (1, 2, 4, 8, 16, 32) if bs <= self.cuda_graph_max_bs]
        self.graph_runner = CudaGraphRunner(self, sizes)
        self.graph_runner.capture()

    def forward(self, batch_size):
        if self.graph_runner is not None and self.graph_runner.can_run(batch_size):
            return self.graph_runner.replay(batch_size)
        return "eager"
