"""This engine's own graph runner: it records which batch sizes it would capture and replays the nearest one."""

import bisect


class CudaGraphRunner:
    """Keyed by batch size, like SGLang's, but this engine's own class with its own constructor."""

    def __init__(self, model_runner, batch_sizes):
        self.model_runner = model_runner
        self.capture_bs = sorted(batch_sizes)
        self.graphs = {}

    def capture(self):
        for bs in reversed(self.capture_bs):
            self.graphs[bs] = f"graph[{bs}]"

    def can_run(self, batch_size):
        return bool(self.graphs) and batch_size <= self.capture_bs[-1]

    def replay(self, batch_size):
        return self.graphs[self.capture_bs[bisect.bisect_left(self.capture_bs, batch_size)]]
