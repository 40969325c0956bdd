"""Host-side work a model does per step: skipped while a graph is being captured (it would synchronise the host),
and kernel warm-up done with the collector frozen, as before a capture."""

from sglang.srt.model_executor.cuda_graph_runner import freeze_gc, get_is_capture_mode


class StepStats:
    """Per-step statistics a model records from its forward pass."""

    def __init__(self):
        self.tokens_seen = []

    def record(self, input_ids):
        """Record the step's token count; nothing while capturing. Returns whether it recorded."""
        if get_is_capture_mode():
            return False
        self.tokens_seen.append(int(input_ids.numel()))
        return True


def warm_up(model, input_ids, enable_cudagraph_gc=False):
    """Run ``model`` once so its kernels are loaded before capture, with the collector frozen unless asked."""
    with freeze_gc(enable_cudagraph_gc):
        return model(input_ids)
