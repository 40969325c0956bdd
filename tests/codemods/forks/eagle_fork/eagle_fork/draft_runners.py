"""The fork's draft runners: SGLang's EAGLE runners with the fork's own graphing limit and counters."""

from sglang.srt.model_executor.cuda_graph_runner import freeze_gc
from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner
from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import EAGLEDraftExtendCudaGraphRunner


class BoundedDraftRunner(EAGLEDraftCudaGraphRunner):
    """Graphs at most ``graph_request_limit`` requests (larger batches draft eagerly), captures with the collector
    frozen, and counts its captures."""

    graph_request_limit = 8
    capture_calls = 0

    def can_run(self, forward_batch):
        return forward_batch.batch_size <= self.graph_request_limit and super().can_run(forward_batch)

    def capture(self):
        self.capture_calls += 1
        with freeze_gc(True):
            super().capture()


class CountingDraftExtendRunner(EAGLEDraftExtendCudaGraphRunner):
    """Counts the draft extends it sends eager."""

    refused = 0

    def can_run(self, forward_batch):
        graphed = super().can_run(forward_batch)
        self.refused += not graphed
        return graphed
