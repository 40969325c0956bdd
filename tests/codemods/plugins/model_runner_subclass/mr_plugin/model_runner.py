"""An engine's model runner built on SGLang's, counting its decode graphs."""

from sglang.srt.model_executor.model_runner import ModelRunner


class CountingModelRunner(ModelRunner):
    """Builds the decode graphs, then remembers how many were captured."""

    def init_device_graphs(self):
        super().init_device_graphs()
        self.graph_count = len(self.graph_runner.graphs) if self.graph_runner is not None else 0


def decode_graphs_of(model_runner: ModelRunner):
    return model_runner.graph_runner
