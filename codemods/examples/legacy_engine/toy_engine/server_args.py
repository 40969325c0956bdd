"""Server arguments, spelled with the legacy keywords, flags and config values."""

import argparse

from cudagraph.legacy.server_args import (
    Backend,
    ConfigError,
    CudaGraphConfig,
    Phase,
    add_cli_args,
    default_buckets,
    resolve,
)

# Argument lists a launcher passes to the engine's command line.
DECODE_ONLY_ARGV = ["--disable-piecewise-cuda-graph", "--cuda-graph-bs", "1", "2", "4", "--cuda-graph-max-bs", "4"]
NO_GRAPHS_ARGV = ["--disable-cuda-graph"]
BREAKABLE_PREFILL_ARGV = [
    "--enable-breakable-cuda-graph",
    "--piecewise-cuda-graph-tokens", "16", "32", "64",
    "--piecewise-cuda-graph-max-tokens", "64",
]
TC_PIECEWISE_PREFILL_ARGV = ["--enforce-piecewise-cuda-graph", "--piecewise-cuda-graph-compiler", "eager"]


def decode_only_config() -> CudaGraphConfig:
    """Decode graphs for batch sizes 1, 2 and 4; prefill eager."""
    return resolve(disable_piecewise_cuda_graph=True, cuda_graph_bs=[1, 2, 4], cuda_graph_max_bs=4)


def no_graphs_config() -> CudaGraphConfig:
    """Everything eager."""
    return resolve(disable_cuda_graph=True)


def breakable_prefill_config() -> CudaGraphConfig:
    """Breakable prefill graphs for 16, 32 and 64 tokens."""
    return resolve(
        enable_breakable_cuda_graph=True,
        piecewise_cuda_graph_tokens=[16, 32, 64],
        piecewise_cuda_graph_max_tokens=64,
    )


def tc_piecewise_prefill_config() -> CudaGraphConfig:
    """torch.compile piecewise prefill graphs."""
    return resolve(enforce_piecewise_cuda_graph=True, piecewise_cuda_graph_compiler="eager")


def config_from_argv(argv) -> CudaGraphConfig:
    """Parse a launcher's argument list the way the engine's CLI does."""
    parser = argparse.ArgumentParser(prog="toy-engine")
    add_cli_args(parser)
    return resolve(parser.parse_args(argv))


def prefill_backend_named(name: str) -> Backend:
    """The prefill backend a config file names; the short spellings are accepted."""
    if name in ("tcpcg", "tcpiecewise"):
        return Backend.TCPIECEWISE
    return Backend(name)


def decode_default_buckets(max_batch_size: int):
    """The decode batch sizes captured when none are given."""
    return default_buckets(Phase.DECODE, max_batch_size)


def is_config_error(error: Exception) -> bool:
    """Whether ``error`` is the config package's error type."""
    return isinstance(error, ConfigError)
