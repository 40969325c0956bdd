"""Test doubles more than one test folder needs (``tests/`` is on ``sys.path`` through the root ``conftest.py``, and
rank processes started with ``spawn`` inherit it)."""

from __future__ import annotations

from cudagraph.runner import ForwardBatch


class StubAttention:
    """Attention hooks that do nothing (the stub model attends to nothing); no host lengths needed."""

    needs_seq_lens_cpu = False

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        pass

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        pass

    def init_forward_metadata_capture_cuda_graph(self, *args: object, **kwargs: object) -> None:
        pass

    def init_forward_metadata_replay_cuda_graph(self, *args: object, **kwargs: object) -> None:
        pass

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1
