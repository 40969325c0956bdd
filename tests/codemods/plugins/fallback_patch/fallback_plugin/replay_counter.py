"""Patch SGLang's decode graph runner class to count replays: the new name on a new SGLang, the legacy one before."""

import functools

try:
    from sglang.srt.model_executor.runner import DecodeCudaGraphRunner as GraphRunner
except ImportError:
    from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner as GraphRunner

REPLAYS = {"count": 0}


def install():
    """Count every replay of the engine's decode graph runner; returns an undo function."""
    original = GraphRunner.replay

    @functools.wraps(original)
    def counted(self, *args, **kwargs):
        REPLAYS["count"] += 1
        return original(self, *args, **kwargs)

    GraphRunner.replay = counted

    def undo():
        GraphRunner.replay = original

    return undo


def is_patched():
    """Whether the counter is installed on the runner class."""
    return getattr(GraphRunner.replay, "__wrapped__", None) is not None
