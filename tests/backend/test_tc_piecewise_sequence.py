"""tc_piecewise's parts without CUDA: ``split_graph`` as a pure function, and a captured shape's flat sequence.

The sequence is recorded by the same wrappers and recorder the backend uses, with ``EagerSegments`` standing in for
CUDA graphs (each piece reruns on its captured arguments into its captured outputs), so a replay runs exactly the
steps a CUDA replay runs: segment launches and split calls, no wrapper, no dynamo.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from unittest import mock

import pytest
import torch
import torch._dynamo
import torch.fx
from hypothesis import given, settings
from hypothesis import strategies as st

from cudagraph.backend import PiecewiseCompiler, split_graph
from cudagraph.backend.piecewise import (
    BindableOpCall,
    EagerSegments,
    PieceWrapper,
    Recordings,
    SplitCallWrapper,
    piece_structure_key,
)
from cudagraph.backend.tc_piecewise import record_shape
from cudagraph.backend_utils import (
    GraphDispatch,
    GraphMode,
    ShapeDescriptor,
    get_graph_dispatch,
    graph_dispatch,
    register_split_op,
    unregister_split_op,
)

_LIBRARY = torch.library.Library("cudagraph_tc_sequence_test", "DEF")
_LIBRARY.define("scale_into(Tensor x, Tensor(a!) out) -> ()")
_LIBRARY.define("shifted(Tensor x) -> Tensor")
STATE = {"scale": 2.0, "shift": 1.0, "op_calls": 0, "bound_calls": 0, "binds": 0}
"""What the ops read when they run (as attention reads the forward context), and what ran."""


def _scale_into(x: torch.Tensor, out: torch.Tensor) -> None:
    STATE["op_calls"] += 1
    torch.mul(x, STATE["scale"], out=out)


def _shifted(x: torch.Tensor) -> torch.Tensor:
    return x + STATE["shift"]


_LIBRARY.impl("scale_into", _scale_into, "CompositeExplicitAutograd")
_LIBRARY.impl("scale_into", lambda x, out: None, "Meta")
_LIBRARY.impl("shifted", _shifted, "CompositeExplicitAutograd")
_LIBRARY.impl("shifted", lambda x: torch.empty_like(x), "Meta")
SCALE_INTO = torch.ops.cudagraph_tc_sequence_test.scale_into
SHIFTED = torch.ops.cudagraph_tc_sequence_test.shifted


def bind_scale_into(x: torch.Tensor, out: torch.Tensor) -> Callable[[], None]:
    STATE["binds"] += 1

    def bound() -> None:
        STATE["bound_calls"] += 1
        torch.mul(x, STATE["scale"], out=out)

    return bound


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


# -- split_graph ----------------------------------------------------------------------------------------------------


def _chain(kinds: list[bool]) -> torch.fx.GraphModule:
    """A chain of ops on one input: ``True`` a split op (``torch.neg``), ``False`` an ordinary one (``add 1``)."""
    graph = torch.fx.Graph()
    value = graph.placeholder("x")
    for is_split in kinds:
        value = graph.call_function(torch.neg, (value,)) if is_split else graph.call_function(operator.add, (value, 1))
    graph.output(value)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=12))
def test_split_graph_gives_one_split_call_per_split_op_and_one_piece_per_run_between(kinds: list[bool]) -> None:
    module = _chain(kinds)
    code_before = module.code
    split = split_graph(module, is_split=lambda target: target is torch.neg)
    runs = sum(1 for index, kind in enumerate(kinds) if not kind and (index == 0 or kinds[index - 1]))
    assert len(split.split_names) == len(split.split_points) == sum(kinds)
    assert len(split.piece_names) == runs
    assert split.order == tuple(sorted(split.order, key=lambda name: int(name.removeprefix("submod_"))))
    x = torch.randn(5)
    torch.testing.assert_close(split.module(x), module(x))
    assert module.code == code_before  # pure: the input is not changed


def test_split_graph_keeps_a_side_effect_before_the_split_that_reads_it() -> None:
    def step(cache: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        cache.copy_(x * 2)  # no users: a KV-cache store
        return SHIFTED(cache)

    module = torch.fx.symbolic_trace(step)
    split = split_graph(module)
    assert len(split.piece_names) == 1 and len(split.split_names) == 1
    assert split.order[0] in split.piece_names  # the store's piece runs first
    cache = torch.zeros(3)
    torch.testing.assert_close(split.module(cache, torch.ones(3)), torch.full((3,), 3.0))


# -- the flat sequence ------------------------------------------------------------------------------------------------


def compiled_forward(recordings: Recordings) -> tuple[Callable[..., torch.Tensor], PiecewiseCompiler]:
    compiler = PiecewiseCompiler(
        "eager",
        wrap_piece=lambda index, piece: PieceWrapper(index, piece, recordings),
        wrap_split=lambda index, module: SplitCallWrapper(index, module, recordings, BindableOpCall.of(module)),
    )
    return torch.compile(forward, backend=compiler, fullgraph=True), compiler


def capture_at_4(recordings: Recordings) -> tuple[object, torch.Tensor, torch.Tensor, PiecewiseCompiler]:
    compiled, compiler = compiled_forward(recordings)
    static_x = torch.arange(4.0)
    compiled(static_x)  # compile and warm up: every wrapper runs eagerly
    sequence, output = record_shape(ShapeDescriptor.decode(4), lambda: compiled(static_x), EagerSegments(), recordings)
    return sequence, static_x, output, compiler


def test_a_captured_shape_replays_pieces_and_split_calls_and_nothing_else() -> None:
    recordings = Recordings()
    sequence, static_x, output, compiler = capture_at_4(recordings)
    assert compiler.stats.pieces == 3 and compiler.stats.split_ops == 2
    assert sequence.pieces == 3 and sequence.segments == 3 and len(sequence.split_calls) == 2
    assert sequence.launches == compiler.stats.pieces + compiler.stats.split_ops
    assert sequence.bound_split_calls == 1 and STATE["binds"] == 1
    assert recordings.active == {}  # the capture is closed

    # New inputs in the static buffer, new per-step state read at replay (as attention reads the forward context).
    static_x.copy_(torch.tensor([1.0, -2.0, 0.5, 4.0]))
    STATE.update(scale=-1.5, shift=10.0)
    compilations = compiler.stats.compilations
    torch._dynamo.reset()  # no guard, no compiled code left: a replay must not need them
    op_calls = STATE["op_calls"]
    with (
        mock.patch.object(PieceWrapper, "__call__", side_effect=AssertionError("a piece wrapper ran at replay")),
        mock.patch.object(SplitCallWrapper, "__call__", side_effect=AssertionError("a split wrapper ran at replay")),
    ):
        sequence.replay()
    assert STATE["bound_calls"] == 1 and STATE["op_calls"] == op_calls  # the in-place op replayed its bound call
    torch.testing.assert_close(output, forward(static_x))  # the static output holds this step's result
    assert compiler.stats.compilations == compilations


def test_a_split_result_that_is_a_new_tensor_is_copied_into_the_one_the_next_piece_reads() -> None:
    recordings = Recordings()
    sequence, static_x, output, _ = capture_at_4(recordings)
    returning = sequence.split_calls[1]
    assert returning.bound is None and len(returning.copy_back) == 1
    address = returning.copy_back[0].data_ptr()
    STATE["shift"] = 100.0
    sequence.replay()
    assert returning.copy_back[0].data_ptr() == address
    torch.testing.assert_close(returning.copy_back[0], static_x * 3 * 2 + 1 + 100.0)
    torch.testing.assert_close(output, (static_x * 3 * 2 + 1 + 100.0).sin())


def test_outside_a_capture_the_wrappers_run_the_compiled_forward_eagerly_at_any_shape() -> None:
    recordings = Recordings()
    compiled, _ = compiled_forward(recordings)
    for size in (4, 9):
        x = torch.randn(size)
        torch.testing.assert_close(compiled(x), forward(x))
    with graph_dispatch(GraphDispatch(GraphMode.EAGER, ShapeDescriptor.decode(9))):
        x = torch.randn(9)
        torch.testing.assert_close(compiled(x), forward(x))
    assert STATE["binds"] == 0


def test_a_capture_dispatch_with_no_open_capture_is_one_clear_error() -> None:
    recordings = Recordings()
    compiled, _ = compiled_forward(recordings)
    compiled(torch.ones(4))
    with (
        graph_dispatch(GraphDispatch(GraphMode.CAPTURE, ShapeDescriptor.decode(4))),
        pytest.raises(RuntimeError, match=r"no capture of that shape is open"),
    ):
        compiled(torch.ones(4))


def test_a_failed_capture_closes_its_recording_and_the_next_one_succeeds() -> None:
    recordings = Recordings()
    compiled, _ = compiled_forward(recordings)
    static_x = torch.arange(4.0)
    compiled(static_x)

    def failing() -> torch.Tensor:
        compiled(static_x)
        raise ValueError("the model failed")

    with pytest.raises(ValueError, match="the model failed"):
        record_shape(ShapeDescriptor.decode(4), failing, EagerSegments(), recordings)
    assert recordings.active == {} and get_graph_dispatch() is None
    sequence, output = record_shape(ShapeDescriptor.decode(4), lambda: compiled(static_x), EagerSegments(), recordings)
    sequence.replay()
    torch.testing.assert_close(output, forward(static_x))


# -- a split op's capture prefix ---------------------------------------------------------------------------------------

_LIBRARY.define("store_and_read(Tensor x, Tensor(a!) cache, Tensor(b!) out, *, bool stored=False) -> ()")
PREFIX_STATE = {"prefix_runs": 0, "stores_in_op": 0, "op_calls": 0}
"""What ran: the prefix (the store in the segment), the store inside the op, the op."""


def _store_and_read(x: torch.Tensor, cache: torch.Tensor, out: torch.Tensor, *, stored: bool = False) -> None:
    """A KV-store-then-attend stand-in: stores ``x`` into ``cache`` (unless ``stored``), then reads the cache with
    per-step state."""
    PREFIX_STATE["op_calls"] += 1
    if not stored:
        PREFIX_STATE["stores_in_op"] += 1
        cache.copy_(x)
    torch.mul(cache, STATE["scale"], out=out)


_LIBRARY.impl("store_and_read", _store_and_read, "CompositeExplicitAutograd")
_LIBRARY.impl("store_and_read", lambda x, cache, out, stored=False: None, "Meta")
STORE_AND_READ = torch.ops.cudagraph_tc_sequence_test.store_and_read


def store_first(
    x: torch.Tensor, cache: torch.Tensor, out: torch.Tensor, *, stored: bool = False
) -> dict[str, bool] | None:
    if stored:
        return None
    PREFIX_STATE["prefix_runs"] += 1
    cache.copy_(x)
    return {"stored": True}


def stored_forward(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    STORE_AND_READ(x * 2, cache, out)
    return out + 1


def capture_stored_forward(binder: object = None) -> tuple[object, torch.Tensor, torch.Tensor, torch.Tensor]:
    register_split_op(STORE_AND_READ, replay_binder=binder, capture_prefix=store_first)  # type: ignore[arg-type]
    recordings = Recordings()
    compiler = PiecewiseCompiler(
        "eager",
        wrap_piece=lambda index, piece: PieceWrapper(index, piece, recordings),
        wrap_split=lambda index, module: SplitCallWrapper(index, module, recordings, BindableOpCall.of(module)),
    )
    compiled = torch.compile(stored_forward, backend=compiler, fullgraph=True)
    static_x, cache = torch.arange(4.0), torch.zeros(4)
    compiled(static_x, cache)  # compile and warm up: the op stores, no prefix
    sequence, output = record_shape(
        ShapeDescriptor.decode(4), lambda: compiled(static_x, cache), EagerSegments(), recordings
    )
    return sequence, static_x, cache, output


@pytest.mark.parametrize("bound", [False, True], ids=["op replayed", "bound call replayed"])
def test_a_capture_prefix_runs_in_the_segment_before_the_split_and_the_op_skips_it(bound: bool) -> None:
    calls = {"bound": 0}

    def bind(x: torch.Tensor, cache: torch.Tensor, out: torch.Tensor, *, stored: bool = False) -> Callable[[], None]:
        assert stored, "the bound call must be the op told to skip the store"

        def attend_only() -> None:
            calls["bound"] += 1
            torch.mul(cache, STATE["scale"], out=out)

        return attend_only

    PREFIX_STATE.update(prefix_runs=0, stores_in_op=0, op_calls=0)
    try:
        sequence, static_x, cache, output = capture_stored_forward(bind if bound else None)
        assert PREFIX_STATE["prefix_runs"] == 1 and sequence.prefixes == 1
        assert sequence.launches == 3  # segment (piece + prefix), split call, segment
        stores_before = PREFIX_STATE["stores_in_op"]
        static_x.copy_(torch.tensor([1.0, -2.0, 0.5, 4.0]))
        STATE["scale"] = -3.0
        cache.zero_()
        sequence.replay()
        assert PREFIX_STATE["prefix_runs"] == 2  # replayed with its segment
        assert PREFIX_STATE["stores_in_op"] == stores_before  # the op no longer stores
        assert calls["bound"] == (1 if bound else 0)
        torch.testing.assert_close(cache, static_x * 2)
        torch.testing.assert_close(output, static_x * 2 * -3.0 + 1)
    finally:
        unregister_split_op(STORE_AND_READ)


def test_a_capture_prefix_is_not_used_for_a_split_op_that_returns_a_tensor() -> None:
    register_split_op(SHIFTED, capture_prefix=lambda x: pytest.fail("a prefix ran for an op that returns a tensor"))
    recordings = Recordings()
    sequence, static_x, output, _ = capture_at_4(recordings)
    assert sequence.prefixes == 0
    sequence.replay()
    torch.testing.assert_close(output, forward(static_x))


# -- compiling each distinct piece once --------------------------------------------------------------------------------


class CountingCompiler:
    """A piece compiler that compiles nothing and counts what it was given."""

    name = "counting"
    cache_dir = None

    def __init__(self) -> None:
        self.compiled: list[torch.fx.GraphModule] = []

    def compile(self, piece: torch.fx.GraphModule, example_inputs: object) -> Callable[..., object]:
        self.compiled.append(piece)
        return piece


def test_pieces_of_the_same_structure_compile_once_and_share_the_result() -> None:
    layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))

    def layered(x: torch.Tensor) -> torch.Tensor:
        for layer in layers:
            x = SHIFTED(torch.relu(layer(x)))
        return x.sum(dim=-1)

    counting = CountingCompiler()
    compiler = PiecewiseCompiler(counting)
    compiled = torch.compile(layered, backend=compiler, fullgraph=True)
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), layered(x))
    # The three layer pieces (each with its own weights as inputs) are one structure; the final sum is another.
    assert compiler.stats.pieces == 4
    assert (compiler.stats.pieces_compiled, compiler.stats.pieces_reused) == (2, 2)
    assert len(counting.compiled) == 2


def test_the_structure_key_tells_constants_and_input_metadata_apart() -> None:
    add_one = torch.fx.symbolic_trace(lambda x: x + 1)
    add_two = torch.fx.symbolic_trace(lambda x: x + 2)
    floats, halves = [torch.ones(3)], [torch.ones(3, dtype=torch.float16)]
    assert piece_structure_key(add_one, floats) != piece_structure_key(add_two, floats)
    assert piece_structure_key(add_one, floats) != piece_structure_key(add_one, halves)


# -- the shape descriptor ---------------------------------------------------------------------------------------------


def test_shape_descriptors_are_hashable_values_and_refuse_negative_sizes() -> None:
    assert {ShapeDescriptor.decode(8): "a"}[ShapeDescriptor(tokens=8, requests=8, uniform_query_len=1)] == "a"
    assert ShapeDescriptor.prefill(64) != ShapeDescriptor.decode(64)
    assert str(ShapeDescriptor.decode(2)) == "tokens=2 requests=2 query_len=1"
    with pytest.raises(ValueError, match="negative"):
        ShapeDescriptor(tokens=-1)
