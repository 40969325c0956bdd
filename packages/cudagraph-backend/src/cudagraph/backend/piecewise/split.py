"""Cutting a dynamo graph at its split ops: a pure FX function, any device, no compiling and no CUDA.

Workflow of ``split_graph``:

1. Walk the nodes in order; every call of a split op (``is_split``, by default the registry breakable breaks at)
   gets a partition of its own, and the nodes between two split ops share one.
2. ``torch.fx.passes.split_module`` builds one submodule per partition, keeping the original node order, so ops with
   side effects and no users (a KV-cache store) stay before the split op that reads what they wrote.
3. The submodules are sorted into *pieces* (compiled and graphed) and *split calls* (one split-op call each, run
   eagerly), in the order the split module calls them.

Not here: compiling pieces (``compiler``), wrapping them for capture (``wrappers``), or deciding what a split op is
(``cudagraph.backend_utils.register_split_op``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.fx
from torch.fx.passes.split_module import split_module

from cudagraph.backend_utils import is_split_op

__all__ = ["SplitGraph", "split_at_split_ops", "split_graph"]

_SUBMODULE_PREFIX = "submod_"


@dataclass(frozen=True)
class SplitGraph:
    """A graph module cut at its split ops.

    ``module`` calls ``submod_<i>`` in order; ``piece_names`` are the submodules between split ops (compiled and
    graphed), ``split_names`` the ones holding one split-op call each, and ``split_points`` the split-op nodes of the
    original graph, in order (one per split name).
    """

    module: torch.fx.GraphModule
    piece_names: tuple[str, ...]
    split_names: tuple[str, ...]
    split_points: tuple[str, ...] = ()

    @property
    def order(self) -> tuple[str, ...]:
        """Every submodule name in call order (pieces and split calls interleaved)."""
        return tuple(sorted(self.piece_names + self.split_names, key=_submodule_number))


def _submodule_number(name: str) -> int:
    return int(name.removeprefix(_SUBMODULE_PREFIX))


def split_graph(graph_module: torch.fx.GraphModule, is_split: Callable[[Any], bool] = is_split_op) -> SplitGraph:
    """Cut ``graph_module`` before and after every ``call_function`` node whose target ``is_split`` accepts.

    A graph with ``n`` split ops, none adjacent and none first or last, gives ``n + 1`` pieces. The input module is
    not changed.

    Example:
        >>> import operator, torch
        >>> graph = torch.fx.symbolic_trace(lambda x: torch.relu(x + 1) * 2)
        >>> split = split_graph(graph, is_split=lambda target: target is torch.relu)
        >>> split.piece_names, split.split_names, split.split_points
        (('submod_0', 'submod_2'), ('submod_1',), ('relu',))
    """
    partition_of: dict[torch.fx.Node, int] = {}
    split_partitions: set[int] = set()
    split_points: list[str] = []
    partition = 0
    for node in graph_module.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "call_function" and is_split(node.target):
            partition += 1
            partition_of[node] = partition
            split_partitions.add(partition)
            split_points.append(node.name)
            partition += 1
        else:
            partition_of[node] = partition
    split = split_module(graph_module, graph_module, lambda node: partition_of[node], keep_original_order=True)
    names = sorted(
        (name for name, _ in split.named_children() if name.startswith(_SUBMODULE_PREFIX)), key=_submodule_number
    )
    pieces = tuple(name for name in names if _submodule_number(name) not in split_partitions)
    splits = tuple(name for name in names if _submodule_number(name) in split_partitions)
    return SplitGraph(split, pieces, splits, tuple(split_points))


def split_at_split_ops(graph_module: torch.fx.GraphModule) -> SplitGraph:
    """``split_graph`` at the registered split ops (the ops the breakable backend breaks at)."""
    return split_graph(graph_module)
