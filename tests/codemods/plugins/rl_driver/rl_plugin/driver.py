"""An RL driver: builds the inference server's arguments and its command line (SGLang's options, not ours)."""

import sglang
from sglang.srt.server_args import ServerArgs

SERVER_COMMAND = "python -m sglang.launch_server --cuda-graph-max-bs 8 --disable-piecewise-cuda-graph"


def launch(command, *extra):
    """What this driver would run (it does not start anything here)."""
    return [*command.split(), *extra]


def rollout_server_args() -> ServerArgs:
    return ServerArgs(disable_cuda_graph=False, cuda_graph_max_bs=8)


def rollout_engine():
    return sglang.Engine(cuda_graph_max_bs=16)


def graphs_enabled(server_args: ServerArgs) -> bool:
    return not server_args.disable_cuda_graph and (server_args.cuda_graph_max_bs or 0) > 0


def server_command():
    return launch(SERVER_COMMAND, "--cuda-graph-bs", "1", "2", "4")
