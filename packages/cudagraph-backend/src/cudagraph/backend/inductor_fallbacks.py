"""Fallback lowerings for custom ops, registered before inductor meets them.

Inductor lowers an operator it has no lowering for (a ``torch.library`` custom op: an engine's own kernels, its
attention or all-reduce op) through an *implicit fallback*, which first logs the call with every input's IR. Up to
torch 2.11 that message is built whether or not the log is on, and an input's IR prints its whole history: on a
decoder's forward, where each layer's op reads the stream every earlier layer wrote, building it grows with the
depth and a whole-forward compile spends minutes there (seen on an H200: ``torch.compile`` of a 28-layer forward
over the Triton kernel set's ops did not finish in 200 s; vLLM registers its ops' fallbacks for the same reason).

``register_inductor_fallbacks`` registers the same fallback inductor would have made (the layout constraint the
op's tags ask for, the default one where they ask for none) ahead of time, so lowering finds it and logs nothing.
The inductor-counting compiler backend does this for the custom ops of every graph it compiles; a caller of plain
``torch.compile`` passes its ops itself.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.fx

BUILTIN_NAMESPACES = frozenset({"aten", "prims", "prim", "_c10d_functional", "c10d_functional", "_c10d", "inductor"})
"""Operator namespaces inductor lowers itself (or handles on purpose): never given a fallback here."""


def custom_ops_of(graph_module: torch.fx.GraphModule) -> list[torch._ops.OpOverload]:
    """The custom operator overloads ``graph_module`` calls (every overload of a packet it calls), in call order,
    each once."""
    found: dict[torch._ops.OpOverload, None] = {}
    for node in graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        if isinstance(target, torch._ops.OpOverloadPacket):
            overloads = [getattr(target, name) for name in target.overloads()]
        elif isinstance(target, torch._ops.OpOverload):
            overloads = [target]
        else:
            continue
        for overload in overloads:
            if overload.namespace not in BUILTIN_NAMESPACES:
                found.setdefault(overload, None)
    return list(found)


def ops_of_namespace(namespace: str) -> list[torch._ops.OpOverload]:
    """Every overload of every operator registered so far under ``namespace`` (``torch.ops.<namespace>``)."""
    packets = getattr(torch.ops, namespace)
    overloads: list[torch._ops.OpOverload] = []
    for name in dir(packets):
        packet = getattr(packets, name, None)
        if isinstance(packet, torch._ops.OpOverloadPacket):
            overloads.extend(getattr(packet, overload) for overload in packet.overloads())
    return overloads


def register_inductor_fallbacks(ops: Iterable[torch._ops.OpOverload]) -> list[torch._ops.OpOverload]:
    """Register inductor's fallback lowering for each op of ``ops`` that has no lowering yet (builtin namespaces
    are skipped), with the layout constraint its tags ask for; returns the ops registered now. Idempotent. On a
    torch whose inductor lacks the functions this needs, registers nothing (inductor then falls back implicitly)."""
    try:
        from torch._inductor import lowering
        from torch._library.utils import get_layout_constraint_tag
    except ImportError:
        return []
    registered = []
    for op in ops:
        if op.namespace in BUILTIN_NAMESPACES or op in lowering.lowerings:
            continue
        constraint = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
        lowering.make_fallback(op, layout_constraint=constraint, warn=False)
        registered.append(op)
    return registered
