"""SGLang's server arguments (stand-in): the CUDA-graph options, their command-line flags and defaults."""

import argparse
import dataclasses

_DEFAULT_CUDA_GRAPH_BS = (1, 2, 4, 8, 12, 16, 24, 32)


@dataclasses.dataclass
class ServerArgs:
    """The options a server is launched with (SGLang's field names, types and defaults)."""

    cuda_graph_max_bs: int | None = None
    cuda_graph_bs: list[int] | None = None
    disable_cuda_graph: bool = False
    disable_cuda_graph_padding: bool = False
    enable_breakable_cuda_graph: bool = False
    enable_cudagraph_gc: bool = False
    debug_cuda_graph: bool = False
    disable_piecewise_cuda_graph: bool = False
    enforce_piecewise_cuda_graph: bool = False
    piecewise_cuda_graph_max_tokens: int | None = None
    piecewise_cuda_graph_tokens: list[int] | None = None
    piecewise_cuda_graph_compiler: str = "eager"
    speculative_algorithm: str | None = None

    def __post_init__(self):
        # SGLang picks the batch sizes from the largest one when none are given
        if self.cuda_graph_max_bs is None:
            self.cuda_graph_max_bs = 8
        if self.cuda_graph_bs is None:
            self.cuda_graph_bs = [bs for bs in _DEFAULT_CUDA_GRAPH_BS if bs <= self.cuda_graph_max_bs]
        if self.piecewise_cuda_graph_tokens is None:
            limit = self.piecewise_cuda_graph_max_tokens or 64
            self.piecewise_cuda_graph_tokens = [tokens for tokens in (16, 32, 64) if tokens <= limit]

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        """SGLang's own definitions of its CUDA-graph flags (another program's options, not cudagraph's)."""
        parser.add_argument("--cuda-graph-max-bs", type=int, default=ServerArgs.cuda_graph_max_bs)
        parser.add_argument("--cuda-graph-bs", type=int, nargs="+")
        parser.add_argument("--disable-cuda-graph", action="store_true")
        parser.add_argument("--disable-cuda-graph-padding", action="store_true")
        parser.add_argument("--enable-breakable-cuda-graph", action="store_true")
        parser.add_argument("--enable-cudagraph-gc", action="store_true")
        parser.add_argument("--debug-cuda-graph", action="store_true")
        parser.add_argument("--disable-piecewise-cuda-graph", action="store_true")
        parser.add_argument("--enforce-piecewise-cuda-graph", action="store_true")
        parser.add_argument("--piecewise-cuda-graph-max-tokens", type=int)
        parser.add_argument("--piecewise-cuda-graph-tokens", type=int, nargs="+")
        parser.add_argument("--piecewise-cuda-graph-compiler", default=ServerArgs.piecewise_cuda_graph_compiler)
        parser.add_argument("--speculative-algorithm")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace):
        """The server arguments a parsed command line asks for."""
        return cls(**{field.name: getattr(args, field.name) for field in dataclasses.fields(cls)})


def prepare_server_args(argv: list[str]) -> ServerArgs:
    """The server arguments of a ``sglang.launch_server`` command line (``argv`` without the program)."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(argv))
