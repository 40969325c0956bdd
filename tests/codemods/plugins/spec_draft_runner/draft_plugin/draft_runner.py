"""A speculative-decoding draft runner (its own class) built on the legacy runner module's helpers."""

from sglang.srt.model_executor.cuda_graph_runner import (
    freeze_gc,
    get_batch_sizes_to_capture,
    get_global_graph_memory_pool,
    get_is_capture_mode,
    model_capture_mode,
    set_global_graph_memory_pool,
)


class DraftCudaGraphRunner:
    """Captures the draft model's steps; shares the target's graph memory pool."""

    def __init__(self, model_runner):
        self.model_runner = model_runner
        self.capture_bs, _ = get_batch_sizes_to_capture(model_runner)
        self.seen_capture_mode = []

    def capture(self):
        with freeze_gc(self.model_runner.server_args.enable_cudagraph_gc), model_capture_mode():
            for _ in self.capture_bs:
                self.seen_capture_mode.append(get_is_capture_mode())
        return self.seen_capture_mode

    @staticmethod
    def release_pool():
        set_global_graph_memory_pool(None)
        return get_global_graph_memory_pool()
