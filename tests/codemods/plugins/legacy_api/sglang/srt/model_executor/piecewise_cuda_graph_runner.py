"""SGLang's piecewise prefill graph runner module (stand-in): one captured prefill per token count, faked."""

import bisect

from sglang.srt.model_executor.cuda_graph_runner import model_capture_mode
from sglang.srt.model_executor.forward_batch_info import ForwardBatch


class PiecewiseCudaGraphRunner:
    """Runs prefill forward passes from pieces captured per token count; captures on construction."""

    def __init__(self, model_runner):
        self.model_runner = model_runner
        self.capture_num_tokens = sorted(model_runner.server_args.piecewise_cuda_graph_tokens)
        self.captured = []
        with model_capture_mode():
            self.capture()

    def capture(self) -> None:
        """Capture every token count, the largest first."""
        for num_tokens in reversed(self.capture_num_tokens):
            self.captured.append(num_tokens)

    def can_run(self, forward_batch: ForwardBatch):
        """Whether the prefill fits the largest captured token count."""
        return len(forward_batch.input_ids) <= self.capture_num_tokens[-1]

    def replay(self, forward_batch: ForwardBatch, **kwargs):
        """Run the prefill on the pieces of the next captured token count."""
        num_tokens = len(forward_batch.input_ids)
        padded = self.capture_num_tokens[bisect.bisect_left(self.capture_num_tokens, num_tokens)]
        return self.model_runner.model.forward(forward_batch.input_ids), padded
