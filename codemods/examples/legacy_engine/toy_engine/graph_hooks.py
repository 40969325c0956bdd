"""The toy engine's decode runner, which records its buckets: written against cudagraph-runner 0.1.0, whose runner
methods were ``capture_one_shape``, ``replay_graph``, ``replay_routed`` and ``static_input_tensors``."""

from cudagraph.runner import DecodeCudaGraphRunner


class RecordingDecodeRunner(DecodeCudaGraphRunner):
    """Records every bucket it captures or replays alone, and the bucket of every step."""

    def capture_one_shape(self, shape):
        self.record("captured", shape)
        return super().capture_one_shape(shape)

    def replay_graph(self, shape):
        self.record("replayed", shape)
        return super().replay_graph(shape)

    def replay_routed(self, batch, route):
        self.record("stepped", route.bucket)
        return super().replay_routed(batch, route)

    def static_input_tensors(self, bucket):
        self.record("checked", bucket)
        return super().static_input_tensors(bucket)

    def record(self, what, bucket):
        """Append ``bucket`` to the list named ``what``."""
        self.__dict__.setdefault(what, []).append(bucket)


def step(runner: RecordingDecodeRunner, batch):
    """One decode step, routed here."""
    return runner.replay_routed(batch, runner.route(batch))
