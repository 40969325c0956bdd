"""SGLang 0.5.13's EAGLE draft runner (stand-in): built from the EAGLE worker as ``cls(eagle_worker)``, it captures in
its constructor, one graph per batch size, and ``replay`` returns the drafted tokens of the padded batch cut to the
batch (SGLang: ``(parent_list, top_scores_index, draft_tokens)``). The GPU work is faked on the CPU: a "graph" is the
eager chain of ``speculative_num_steps`` draft forwards, run again at replay."""

from collections.abc import Callable

from sglang.srt.model_executor.cuda_graph_runner import get_batch_sizes_to_capture


class EAGLEDraftCudaGraphRunner:
    """SGLang's draft-decode graph runner, as far as a fork's subclass reaches it."""

    def __init__(self, eagle_worker, *, draft_attn_backend=None, speculative_num_steps=None):
        self.eagle_worker = eagle_worker
        self.model_runner = model_runner = eagle_worker.model_runner
        self.graphs = {}
        self.output_buffers = {}
        self.speculative_num_steps = (
            eagle_worker.speculative_num_steps if speculative_num_steps is None else speculative_num_steps
        )
        self.draft_attn_backend = draft_attn_backend or model_runner.draft_attn_backend
        self.capture_bs, self.compile_bs = get_batch_sizes_to_capture(model_runner)
        self.max_bs = max(self.capture_bs)
        self.capture()

    def can_run(self, forward_batch) -> bool:
        return forward_batch.batch_size <= self.max_bs

    def _create_graph(self):
        return object()

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            self.graphs[bs], self.output_buffers[bs] = self.capture_one_batch_size(bs, self.eagle_worker.draft_forward)

    def capture_one_batch_size(self, num_seqs: int, forward: Callable, stream_idx: int = 0):
        return self._create_graph(), forward

    def _postprocess_output_to_raw_bs(self, out, raw_bs):
        return out[:raw_bs]

    def replay(self, forward_batch):
        raw_bs = forward_batch.batch_size
        bs = min(size for size in self.capture_bs if size >= raw_bs)
        return self._postprocess_output_to_raw_bs(self.output_buffers[bs](forward_batch), raw_bs)
