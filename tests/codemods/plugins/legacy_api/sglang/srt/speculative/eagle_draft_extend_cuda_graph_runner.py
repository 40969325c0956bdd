"""SGLang 0.5.13's EAGLE draft-extend runner (stand-in): built from the EAGLE worker as ``cls(eagle_worker)``,
captures in its constructor, one graph per batch size of ``speculative_num_steps + 1`` tokens a request. The GPU work
is faked on the CPU."""

from collections.abc import Callable

from sglang.srt.model_executor.cuda_graph_runner import get_batch_sizes_to_capture


class EAGLEDraftExtendCudaGraphRunner:
    """SGLang's draft-extend graph runner, as far as a fork's subclass reaches it."""

    def __init__(self, eagle_worker, *, draft_extend_attn_backend=None, speculative_num_steps=None):
        self.eagle_worker = eagle_worker
        self.model_runner = model_runner = eagle_worker.model_runner
        self.graphs = {}
        self.output_buffers = {}
        self.speculative_num_steps = (
            eagle_worker.speculative_num_steps if speculative_num_steps is None else speculative_num_steps
        )
        self.num_tokens_per_bs = self.speculative_num_steps + 1
        self.capture_bs, self.compile_bs = get_batch_sizes_to_capture(model_runner, self.num_tokens_per_bs)
        self.max_bs = max(self.capture_bs)
        self.capture()

    def can_run(self, forward_batch) -> bool:
        return forward_batch.batch_size <= self.max_bs

    def _create_graph(self):
        return object()

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            self.graphs[bs], self.output_buffers[bs] = self.capture_one_batch_size(bs, self.eagle_worker.draft_forward)

    def capture_one_batch_size(self, bs: int, forward: Callable, stream_idx: int = 0):
        return self._create_graph(), forward

    def replay(self, forward_batch):
        bs = min(size for size in self.capture_bs if size >= forward_batch.batch_size)
        return self.output_buffers[bs](forward_batch)
