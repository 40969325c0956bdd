"""A platform's decode graph runner, written against the legacy runner's internals.

It overrides the legacy per-batch-size capture hook and keeps its own graph table, as platform plugins of
SGLang-style engines do. The new decode runner captures through ``capture_bucket(bucket)`` and has no ``graphs``
table, so a migration cannot move this class by renaming: it stays on the legacy name, marked for a manual step.
"""

from cudagraph.legacy.cuda_graph_runner import CudaGraphRunner


class PlatformGraphRunner(CudaGraphRunner):
    """Keys its graphs by a platform-specific name."""

    platform = "toy-npu"

    @staticmethod
    def graph_key(batch_size: int) -> str:
        """The name a captured batch size is stored under."""
        return f"{PlatformGraphRunner.platform}-bs{batch_size}"

    def capture_one_batch_size(self, batch_size, forward):
        """Capture one batch size into the platform's graph table."""
        self.graphs[self.graph_key(batch_size)] = forward
        return self.graphs[self.graph_key(batch_size)]
