"""An engine's model runner built on SGLang's: it counts the decode graphs SGLang captured and reports them."""

from sglang.srt.model_executor.model_runner import ModelRunner


class CountingModelRunner(ModelRunner):
    """SGLang's model runner, remembering how many decode graphs and prefill pieces were captured."""

    def init_device_graphs(self):
        super().init_device_graphs()
        self.decode_graph_count = len(self.graph_runner.graphs) if self.graph_runner is not None else 0

    def graph_summary(self):
        """What was captured, for the engine's startup log."""
        prefill = self.piecewise_cuda_graph_runner
        return {
            "decode_batch_sizes": sorted(self.graph_runner.graphs) if self.graph_runner is not None else [],
            "prefill_token_counts": prefill.capture_num_tokens if prefill is not None else [],
        }


def decode_graphs_of(model_runner: ModelRunner):
    """The decode graph runner of any SGLang model runner (``None`` with graphs disabled)."""
    return model_runner.graph_runner
