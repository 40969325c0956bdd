"""One split-op registry: ``register_split_op`` and ``@split_op`` write the list ``breakable`` breaks at."""

from __future__ import annotations

import pytest
import torch

from cudagraph.backend_utils import (
    break_options,
    is_split_op,
    register_break_op,
    register_split_op,
    registered_break_ops,
    registered_split_ops,
    split_op,
    unregister_break_op,
    unregister_split_op,
)

_LIBRARY = torch.library.Library("cudagraph_split_test", "DEF")
_LIBRARY.define("scale_into(Tensor x, Tensor(a!) out) -> ()")
_LIBRARY.impl("scale_into", lambda x, out: out.copy_(x * 2) and None, "CompositeExplicitAutograd")
SCALE_INTO = torch.ops.cudagraph_split_test.scale_into


def test_the_split_names_are_the_break_registry_not_a_copy() -> None:
    assert register_split_op is register_break_op
    assert unregister_split_op is unregister_break_op
    assert registered_split_ops is registered_break_ops


@pytest.mark.parametrize(
    "spelling",
    ["cudagraph_split_test::scale_into", "cudagraph_split_test::scale_into.default", SCALE_INTO, SCALE_INTO.default],
)
def test_a_split_op_registered_by_any_spelling_is_a_break_point(spelling: object) -> None:
    register_split_op(spelling)  # type: ignore[arg-type]
    try:
        assert break_options(SCALE_INTO.default) is not None
        assert is_split_op(SCALE_INTO.default) and is_split_op(SCALE_INTO)
    finally:
        unregister_split_op(spelling)  # type: ignore[arg-type]
    assert not is_split_op(SCALE_INTO.default) and not is_split_op(SCALE_INTO)


def test_the_decorator_registers_a_custom_op() -> None:
    @split_op
    @torch.library.custom_op("cudagraph_split_test::copy_into", mutates_args=("out",))
    def copy_into(x: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(x)

    try:
        assert is_split_op(torch.ops.cudagraph_split_test.copy_into.default)
    finally:
        unregister_split_op(copy_into)  # type: ignore[arg-type]
    assert not is_split_op(torch.ops.cudagraph_split_test.copy_into.default)


@pytest.mark.parametrize("name", ["no_namespace", "cudagraph_split_test::missing", "::x"])
def test_an_unknown_qualified_name_is_one_clear_error(name: str) -> None:
    with pytest.raises(ValueError, match=r"namespace::name|no torch operator"):
        register_split_op(name)


def test_the_engine_attention_op_is_a_split_op_and_the_kv_store_is_not() -> None:
    from cudagraph.engine.attention.op import store_kv, unified_attention

    assert is_split_op(unified_attention.default)
    assert not is_split_op(store_kv.default)
