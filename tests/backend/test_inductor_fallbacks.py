"""Custom ops get inductor's fallback lowering before inductor meets them: listed from a graph (every overload once,
builtin namespaces left out), registered with the layout constraint their tags ask for, idempotently; and a graph
compiled through the counting inductor backend lowers them without inductor's implicit-fallback path (which, up to
torch 2.11, stringifies every input's IR history)."""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch
import torch._functorch.config
import torch._inductor.config
import torch.fx
from torch import Tensor

from cudagraph.backend import CompileStats, custom_ops_of, ops_of_namespace, register_inductor_fallbacks
from cudagraph.backend.compile_forward import counting_inductor

NAMESPACE = "cudagraph_fallback_test"


@torch.library.custom_op(f"{NAMESPACE}::scaled", mutates_args=())
def scaled(x: Tensor, factor: float) -> Tensor:
    return x * factor


@scaled.register_fake
def _(x: Tensor, factor: float) -> Tensor:
    return torch.empty_like(x)


@torch.library.custom_op(f"{NAMESPACE}::shifted", mutates_args=(), tags=(torch.Tag.needs_fixed_stride_order,))
def shifted(x: Tensor, amount: float) -> Tensor:
    return x + amount


@shifted.register_fake
def _(x: Tensor, amount: float) -> Tensor:
    return torch.empty_like(x)


@torch.library.custom_op(f"{NAMESPACE}::chained", mutates_args=())
def chained(x: Tensor) -> Tensor:
    return x.sin()


@chained.register_fake
def _(x: Tensor) -> Tensor:
    return torch.empty_like(x)


def graph_calling(*targets: object) -> torch.fx.GraphModule:
    """A graph that calls each target on the running value in turn."""
    graph = torch.fx.Graph()
    value = graph.placeholder("x")
    for target in targets:
        args = (value,) if target in (torch.ops.aten.relu.default, chained._opoverload) else (value, 2.0)
        value = graph.call_function(target, args)
    graph.output(value)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_custom_ops_of_lists_each_custom_overload_once_in_call_order_and_skips_aten() -> None:
    packet = torch.ops.cudagraph_fallback_test.scaled
    module = graph_calling(shifted._opoverload, torch.ops.aten.relu.default, packet, scaled._opoverload)
    assert custom_ops_of(module) == [shifted._opoverload, scaled._opoverload]


def test_ops_of_namespace_lists_every_registered_op() -> None:
    assert {op.name() for op in ops_of_namespace(NAMESPACE)} >= {
        f"{NAMESPACE}::scaled",
        f"{NAMESPACE}::shifted",
        f"{NAMESPACE}::chained",
    }


def test_registration_installs_the_fallback_with_the_tagged_layout_constraint_once() -> None:
    from torch._inductor import lowering

    op = shifted._opoverload
    registered = register_inductor_fallbacks([op, torch.ops.aten.relu.default])
    assert op in lowering.lowerings
    assert registered in ([op], [])  # [] when an earlier test of this process registered it
    assert lowering.maybe_layout_constraints(op) is lowering.constrain_to_fx_strides
    assert register_inductor_fallbacks([op]) == []  # idempotent
    assert torch.ops.aten.relu.default not in registered


class Messages(logging.Handler):
    """Keeps every message logged to the logger it is attached to (torch's loggers do not propagate to pytest's)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.slow
def test_a_counted_inductor_compile_lowers_custom_ops_without_the_implicit_fallback() -> None:
    """Inductor on CPU (a C++ compiler): the compiled chain equals eager, and inductor never logs an implicit
    fallback for the chain's op, which it does for an op compiled by plain inductor (the control)."""

    def forward(x: Tensor) -> Tensor:
        for _ in range(4):
            x = torch.ops.cudagraph_fallback_test.chained(x) + 1.0
        return x

    def control(x: Tensor) -> Tensor:
        return torch.ops.cudagraph_fallback_test.scaled(x, 3.0).cos()

    x = torch.randn(8, 16)
    stats = CompileStats()
    logger, handler = logging.getLogger("torch._inductor.graph"), Messages()
    with contextlib.ExitStack() as stack:
        # Lowering runs only on a compile-cache miss: caches off, so that both graphs are lowered here.
        stack.enter_context(torch._inductor.config.patch(fx_graph_cache=False))
        stack.enter_context(torch._functorch.config.patch(enable_autograd_cache=False))
        level = logger.level
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        stack.callback(logger.setLevel, level)
        stack.callback(logger.removeHandler, handler)
        torch._dynamo.reset()
        got = torch.compile(forward, backend=counting_inductor(stats), fullgraph=True)(x)
        torch._dynamo.reset()
        control_got = torch.compile(control, backend="inductor", fullgraph=True)(x)
    torch.testing.assert_close(got, forward(x))
    torch.testing.assert_close(control_got, control(x))
    assert stats.compilations == 1
    implicit = [message for message in handler.messages if "implicit fallback" in message]
    assert not any("chained" in message for message in implicit), implicit
    assert any("scaled" in message for message in implicit), "the control op was not implicitly fallen back"
