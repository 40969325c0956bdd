"""A platform's decode graph runner: SGLang's runner with the platform's own graph objects."""

from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner


class NPUGraphRunner(CudaGraphRunner):
    """Creates platform graphs and tags each capture with the platform."""

    def _create_device_graph(self):
        return {"replays": 0, "device": "npu"}

    def capture_one_batch_size(self, bs, forward, stream_idx=None):
        graph, output = super().capture_one_batch_size(bs, forward, stream_idx)
        graph["batch_size"] = bs
        return graph, output

    def captured_on_platform(self):
        return all(graph["device"] == "npu" for graph in self.graphs.values())
