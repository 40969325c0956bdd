"""The rollout's launch settings, rendered into an SGLang server's command line.

The fields are this framework's own names, chosen to match SGLang's flags one for one: ``launch_command`` turns each
field into the flag of the same spelling, which SGLang defines and parses.
"""

import dataclasses

from sglang.srt.server_args import ServerArgs, prepare_server_args

LAUNCHER = ["python", "-m", "sglang.launch_server"]


@dataclasses.dataclass
class RolloutConfig:
    """How the rollout servers run: graphs on by default, sized for the rollout batch."""

    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int = 8
    cuda_graph_bs: list[int] | None = None
    rollout_batch_size: int = 8
    """The trainer's own setting: never passed to SGLang."""


LAUNCH_FIELDS = ("disable_cuda_graph", "cuda_graph_max_bs", "cuda_graph_bs")
"""The fields that become SGLang's flags."""


def launch_command(config: RolloutConfig) -> list[str]:
    """The server's argv: each launch field as the flag of the same name (``cuda_graph_max_bs`` ->
    ``--cuda-graph-max-bs``)."""
    argv = list(LAUNCHER)
    for name in LAUNCH_FIELDS:
        value = getattr(config, name)
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif isinstance(value, list):
            argv += [flag, *(str(item) for item in value)]
        elif value not in (None, False):
            argv += [flag, str(value)]
    return argv


def server_args(config: RolloutConfig) -> ServerArgs:
    """What SGLang makes of the command line (its own parser)."""
    return prepare_server_args(launch_command(config)[len(LAUNCHER) :])
