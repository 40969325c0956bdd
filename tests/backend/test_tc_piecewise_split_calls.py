"""tc_piecewise's split-op calls without CUDA: recorded per shape at capture, and at replay an in-place op with a
replay binder runs its bound callable (not the op), while an op that returns a new tensor is run again on the step's
arguments and its result copied into the tensor the next piece was captured reading. Pieces stand in for their graphs
(run again, outputs copied into the captured ones); the owner is a stand-in that holds the capture/replay mode as the
backend does."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
import torch._dynamo

from cudagraph.backend import PiecewiseCompiler
from cudagraph.backend.tc_piecewise import _BindableOpCall, _SplitCall
from cudagraph.backend_utils import CaptureOptions, register_split_op, unregister_split_op

_LIBRARY = torch.library.Library("cudagraph_tc_split_test", "DEF")
_LIBRARY.define("scale_into(Tensor x, Tensor(a!) out) -> ()")
_LIBRARY.define("shifted(Tensor x) -> Tensor")
STATE = {"scale": 2.0, "shift": 1.0, "op_calls": 0, "bound_calls": 0, "binds": 0}
"""What the ops read when they run (as attention reads the forward context), and what ran."""


def _scale_into(x: torch.Tensor, out: torch.Tensor) -> None:
    STATE["op_calls"] += 1
    torch.mul(x, STATE["scale"], out=out)


def _scale_into_meta(x: torch.Tensor, out: torch.Tensor) -> None:
    return None


def _shifted(x: torch.Tensor) -> torch.Tensor:
    return x + STATE["shift"]


_LIBRARY.impl("scale_into", _scale_into, "CompositeExplicitAutograd")
_LIBRARY.impl("scale_into", _scale_into_meta, "Meta")
_LIBRARY.impl("shifted", _shifted, "CompositeExplicitAutograd")
_LIBRARY.impl("shifted", lambda x: torch.empty_like(x), "Meta")
SCALE_INTO = torch.ops.cudagraph_tc_split_test.scale_into
SHIFTED = torch.ops.cudagraph_tc_split_test.shifted


def bind_scale_into(x: torch.Tensor, out: torch.Tensor) -> Callable[[], None]:
    STATE["binds"] += 1

    def bound() -> None:
        STATE["bound_calls"] += 1
        torch.mul(x, STATE["scale"], out=out)

    return bound


@dataclass
class StandInOwner:
    """What a split call reads of its backend: the mode and shape of the current pass, and the capture options."""

    _piece_mode: str | None = None
    _piece_shape: int = 0
    options: CaptureOptions = field(default_factory=lambda: CaptureOptions(num_warmups=0))


@pytest.fixture(autouse=True)
def registered_ops() -> object:
    register_split_op(SCALE_INTO, replay_binder=bind_scale_into)
    register_split_op(SHIFTED)
    STATE.update(scale=2.0, shift=1.0, op_calls=0, bound_calls=0, binds=0)
    torch._dynamo.reset()
    yield
    unregister_split_op(SCALE_INTO)
    unregister_split_op(SHIFTED)
    torch._dynamo.reset()


def forward(x: torch.Tensor) -> torch.Tensor:
    h = x * 3
    out = torch.empty_like(h)
    SCALE_INTO(h, out)  # in place, bindable
    y = SHIFTED(out + 1)  # returns a new tensor
    return y.sin()


@dataclass
class GraphLikePiece:
    """A piece that behaves like its CUDA graphs: at replay its outputs land in the tensors captured for the shape
    (run again here, and copied into them), which is what the split calls after it were bound to."""

    piece: Callable[..., object]
    owner: StandInOwner
    outputs: dict[int, object] = field(default_factory=dict)

    def __call__(self, *args: object) -> object:
        mode, shape = self.owner._piece_mode, self.owner._piece_shape
        result = self.piece(*args)
        if mode == "capture":
            self.outputs[shape] = result
        elif mode == "replay" and shape in self.outputs:
            static = self.outputs[shape]
            for kept, fresh in zip(_tensors(static), _tensors(result), strict=True):
                kept.copy_(fresh)
            return static
        return result


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _tensors(item)]
    return []


def compiled_with_split_calls(owner: StandInOwner) -> tuple[Callable[..., torch.Tensor], list[_SplitCall]]:
    splits: list[_SplitCall] = []

    def wrap_split(index: int, module: torch.fx.GraphModule) -> _SplitCall:
        split = _SplitCall(index, module, owner, _BindableOpCall.of(module))  # type: ignore[arg-type]
        splits.append(split)
        return split

    def wrap_piece(index: int, piece: Callable[..., object]) -> GraphLikePiece:
        return GraphLikePiece(piece, owner)

    compiler = PiecewiseCompiler("eager", wrap_piece=wrap_piece, wrap_split=wrap_split)
    return torch.compile(forward, backend=compiler, fullgraph=True), splits


def captured_at_4(owner: StandInOwner) -> tuple[Callable[..., torch.Tensor], list[_SplitCall], torch.Tensor]:
    """Compile (eagerly), then capture shape 4 on a static input; the owner is left in capture mode."""
    compiled, splits = compiled_with_split_calls(owner)
    static_x = torch.arange(4.0)
    compiled(static_x)
    owner._piece_mode, owner._piece_shape = "capture", 4
    return compiled, splits, static_x


def test_only_a_lone_in_place_split_op_with_a_binder_is_bindable() -> None:
    owner = StandInOwner()
    compiled, splits = compiled_with_split_calls(owner)
    x = torch.arange(4.0)
    torch.testing.assert_close(compiled(x), forward(x))
    assert [split.bindable is not None for split in splits] == [True, False]


def test_replay_runs_the_bound_call_and_copies_returned_tensors_back() -> None:
    owner = StandInOwner()
    compiled, splits, static_x = captured_at_4(owner)
    captured = compiled(static_x).clone()
    assert STATE["binds"] == 1 and [split.is_bound(4) for split in splits] == [True, False]
    op_calls = STATE["op_calls"]

    # New inputs in the static buffer, new per-step state read at replay (as attention reads the forward context).
    static_x.copy_(torch.tensor([1.0, -2.0, 0.5, 4.0]))
    STATE.update(scale=-1.5, shift=10.0)
    owner._piece_mode = "replay"
    got = compiled(static_x)
    owner._piece_mode = None
    expected = forward(static_x)
    torch.testing.assert_close(got, expected)
    assert not torch.allclose(got, captured)
    # The in-place op replayed its bound call, not the op.
    assert STATE["bound_calls"] == 1 and STATE["op_calls"] == op_calls + 1  # + 1: the eager `expected` above


def test_the_split_returning_a_tensor_runs_on_the_step_arguments_into_the_captured_tensor() -> None:
    owner = StandInOwner()
    compiled, splits, static_x = captured_at_4(owner)
    compiled(static_x)
    returning = splits[1]
    (captured_output,) = _tensors(returning.entries[4].output)
    address = captured_output.data_ptr()
    STATE["shift"] = 100.0
    owner._piece_mode = "replay"
    replayed = returning(torch.full((4,), 5.0))  # the step's argument (a graph piece hands its static output)
    owner._piece_mode = None
    (replayed_tensor,) = _tensors(replayed)
    assert replayed_tensor.data_ptr() == address  # the same tensor the next piece was captured reading
    torch.testing.assert_close(replayed_tensor, torch.full((4,), 105.0))  # computed from this step's argument


def test_an_unknown_shape_runs_the_split_op_as_is_and_shapes_are_discarded() -> None:
    owner = StandInOwner()
    compiled, splits, static_x = captured_at_4(owner)
    compiled(static_x)
    owner._piece_mode, owner._piece_shape = "replay", 8
    x8 = torch.arange(8.0)
    torch.testing.assert_close(compiled(x8), forward(x8))
    assert STATE["bound_calls"] == 0
    for split in splits:
        split.discard(4)
    assert not any(split.is_bound(4) for split in splits)
