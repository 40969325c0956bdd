"""A draft runner that runs the legacy runner's capture loop on itself, without deriving from it."""

from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner


class DraftRunner:
    """Captures one graph per draft batch size with the legacy loop, on state of its own."""

    def __init__(self, model_runner, capture_bs):
        self.model_runner = model_runner
        self.capture_bs = list(capture_bs)
        self.graphs = {}
        self.output_buffers = {}
        self.captured = []

    def capture_one_batch_size(self, bs, forward):
        self.captured.append(bs)
        return ("graph", bs), {"logits": [0.0] * bs}

    def capture(self):
        CudaGraphRunner.capture(self)
        return sorted(self.graphs)
