"""An RL driver: builds the inference server's arguments and command lines. These are SGLang's own options (its
``ServerArgs``, its ``launch_server`` flags), not cudagraph's: SGLang defines and parses them."""

import sglang
from sglang.srt.server_args import ServerArgs

ROLLOUT_MAX_BS = 8

ROLLOUT_SERVER = ["python", "-m", "sglang.launch_server", "--cuda-graph-max-bs", "8"]

EVAL_SERVER = "python -m sglang.launch_server --disable-cuda-graph --disable-piecewise-cuda-graph"


def launch(command, *extra_args):
    """The argv this driver hands to its cluster launcher for ``command`` (a list, or a string split on spaces)."""
    argv = command.split() if isinstance(command, str) else list(command)
    return [*argv, *extra_args]


def rollout_server_args() -> ServerArgs:
    """Graphs on, sized for the rollout batch."""
    return ServerArgs(disable_cuda_graph=False, cuda_graph_max_bs=ROLLOUT_MAX_BS)


def reference_engine():
    """The reference policy's engine runs eagerly: its batches vary too much for graphs to pay."""
    return sglang.Engine(disable_cuda_graph=True, cuda_graph_max_bs=ROLLOUT_MAX_BS)


def graphs_enabled(server_args: ServerArgs) -> bool:
    """Whether a server with these arguments replays decode graphs."""
    return not server_args.disable_cuda_graph and (server_args.cuda_graph_max_bs or 0) > 0


def rollout_command():
    """The rollout server's command line."""
    return launch(ROLLOUT_SERVER)


def eval_command():
    """The evaluation server's command line, with the batch sizes it graphs."""
    return launch(EVAL_SERVER) + launch("--cuda-graph-bs 1 2 4")
