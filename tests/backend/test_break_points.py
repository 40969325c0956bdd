"""Break points outside a capture are plain calls; the operator registry accepts torch operators only."""

from __future__ import annotations

import pytest
import torch

from cudagraph.backend_utils import (
    add_eager,
    eager_break,
    force_split,
    register_break_op,
    registered_break_ops,
    unregister_break_op,
    weak_ref_tensor,
    weak_ref_tensors,
)
from cudagraph.backend_utils.break_ops import break_options

_LIBRARY = torch.library.Library("cudagraph_backend_test_cpu", "DEF")
_LIBRARY.define("scale_into(Tensor x, Tensor(a!) output) -> ()")
_LIBRARY.define("double(Tensor x) -> Tensor")


def _scale_into(x: torch.Tensor, output: torch.Tensor) -> None:
    output.copy_(x * 2)


_LIBRARY.impl("scale_into", _scale_into, "CompositeExplicitAutograd")
_LIBRARY.impl("double", lambda x: x * 2, "CompositeExplicitAutograd")
SCALE_INTO = torch.ops.cudagraph_backend_test_cpu.scale_into
DOUBLE = torch.ops.cudagraph_backend_test_cpu.double


def test_add_eager_outside_a_capture_is_a_plain_call() -> None:
    x = torch.ones(3)
    assert add_eager(torch.mul, x, 4.0).tolist() == [4.0, 4.0, 4.0]
    assert add_eager(torch.Tensor.add_, x, other=1.0) is x
    assert x.tolist() == [2.0, 2.0, 2.0]


def test_break_points_outside_a_capture_never_touch_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_device(*args: object, **kwargs: object) -> None:
        raise AssertionError("a break point outside a capture must not touch CUDA")

    for name in ("current_stream", "current_device", "is_current_stream_capturing", "CUDAGraph"):
        monkeypatch.setattr(torch.cuda, name, no_device)
    x = torch.ones(2)
    force_split()
    assert add_eager(torch.add, x, 1.0).tolist() == [2.0, 2.0]
    force_split()


def test_eager_break_decorator_keeps_the_function() -> None:
    calls: list[str] = []

    def stub(x: torch.Tensor) -> torch.Tensor:
        calls.append("stub")
        return x

    @eager_break(capture_stub=stub)
    def triple(x: torch.Tensor) -> torch.Tensor:
        """Multiply by three."""
        calls.append("real")
        return x * 3

    assert triple(torch.ones(1)).item() == 3.0
    assert calls == ["real"]  # the stub only runs while capturing
    assert triple.__name__ == "triple" and triple.__doc__ == "Multiply by three."
    assert triple.capture_stub is stub


def test_eager_break_on_a_method_binds_self() -> None:
    class Scaler:
        factor = 5.0

        @eager_break
        def apply(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.factor

    assert Scaler().apply(torch.ones(2)).tolist() == [5.0, 5.0]


def test_register_a_packet_breaks_every_overload() -> None:
    register_break_op(SCALE_INTO)
    try:
        assert SCALE_INTO in registered_break_ops()
        assert break_options(SCALE_INTO.default) is not None
        assert break_options(DOUBLE.default) is None
    finally:
        unregister_break_op(SCALE_INTO)
    assert break_options(SCALE_INTO.default) is None


def test_register_one_overload_with_a_capture_stub() -> None:
    def stub(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    register_break_op(DOUBLE.default, capture_stub=stub)
    try:
        options = break_options(DOUBLE.default)
        assert options is not None and options.capture_stub is stub
    finally:
        unregister_break_op(DOUBLE.default)
    assert break_options(DOUBLE.default) is None


def test_register_rejects_a_python_function_and_says_what_to_use() -> None:
    with pytest.raises(TypeError, match="eager_break"):
        register_break_op(torch.relu)  # type: ignore[arg-type]


def test_registered_op_runs_normally_outside_a_capture() -> None:
    register_break_op(SCALE_INTO)
    try:
        output = torch.zeros(2)
        SCALE_INTO(torch.tensor([1.0, 2.0]), output)
        assert output.tolist() == [2.0, 4.0]
    finally:
        unregister_break_op(SCALE_INTO)


def test_weak_ref_tensor_aliases_without_owning() -> None:
    owner = torch.arange(12.0).reshape(3, 4)[:, 1:3]
    uses_before = torch._C._storage_Use_Count(owner.untyped_storage()._cdata)
    alias = weak_ref_tensor(owner)
    assert torch._C._storage_Use_Count(owner.untyped_storage()._cdata) == uses_before
    assert alias.data_ptr() == owner.data_ptr()
    assert alias.shape == owner.shape and alias.stride() == owner.stride() and alias.dtype == owner.dtype
    owner.fill_(7.0)
    assert alias.eq(7.0).all()
    view = owner[0]
    assert torch._C._storage_Use_Count(owner.untyped_storage()._cdata) > uses_before  # a view does own
    del view


def test_weak_ref_tensors_maps_nested_values() -> None:
    first, second = torch.ones(2), torch.zeros(3)
    result = weak_ref_tensors({"a": (first, 3), "b": [second]})
    assert result["a"][1] == 3
    assert result["a"][0].data_ptr() == first.data_ptr() and result["b"][0].data_ptr() == second.data_ptr()
