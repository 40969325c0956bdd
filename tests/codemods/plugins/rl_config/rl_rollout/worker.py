"""The project's own wrapper around SGLang's model runner, and what the trainer does with its graphs.

After a weight update the trainer re-captures the rollout engine's decode graphs through the wrapper: the member
names are SGLang's (``graph_runner``, ``init_device_graphs``), reached through an attribute of the project's class.
"""

from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs


class RolloutWorker:
    """Holds SGLang's model runner for the trainer."""

    def __init__(self, server_args: ServerArgs):
        self.model_runner = ModelRunner(server_args)
        self.model_runner.initialize()
        self.weight_version = 0


def graphs_ready(worker: RolloutWorker) -> bool:
    """Whether the worker's engine replays decode graphs (SGLang's runner may have none: eager)."""
    return getattr(worker.model_runner, "graph_runner", None) is not None


def update_weights(worker: RolloutWorker) -> None:
    """New weights: re-capture the decode graphs, which hold the old ones' addresses."""
    worker.weight_version += 1
    worker.model_runner.init_device_graphs()
