"""Rollout engines for an RL trainer. SGLang's options are gathered in dicts first, from the trainer's config, then
handed to SGLang's ``ServerArgs``/``Engine`` (imported where the trainer's launcher imports them from)."""

import sglang
from sglang.srt.entrypoints.http_server import ServerArgs

ENGINE_KWARGS = dict(disable_cuda_graph=True, cuda_graph_max_bs=8, speculative_algorithm=None)
"""The reference policy's engine: eager, its batches vary too much for graphs to pay."""


def rollout_server_args(enforce_eager, batch_sizes):
    """The rollout server's arguments, from the trainer's config."""
    args = {
        "disable_cuda_graph": enforce_eager,
        "cuda_graph_bs": list(batch_sizes),
    }
    return ServerArgs(**args)


def rollout_engine(**overrides):
    """A rollout engine: graphs on and sized for the rollout batch unless the caller says otherwise."""
    kwargs = dict(overrides)
    kwargs.setdefault("disable_cuda_graph", False)
    kwargs.setdefault("cuda_graph_max_bs", 16)
    if kwargs.get("cuda_graph_max_bs") > 16:
        kwargs["cuda_graph_max_bs"] = 16
    return sglang.Engine(**kwargs)


def reference_engine():
    """The reference policy's engine."""
    return sglang.Engine(**ENGINE_KWARGS)


def graphs_enabled(server_args):
    """Whether a server with these arguments replays decode graphs."""
    return not server_args.disable_cuda_graph and (server_args.cuda_graph_max_bs or 0) > 0
