"""BreakableCUDAGraph on the device: replay equals eager bit for bit, for every break source and output convention.

The eager functions below read a value back to the host (``.item()``), which is illegal under stream capture: a
correct result after replay with fresh inputs proves they ran eagerly, at capture and at every replay.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cudagraph.backend_utils import (
    BreakableCaptureError,
    BreakableCUDAGraph,
    CaptureOptions,
    add_eager,
    breakable_capture,
    eager_break,
    force_split,
    is_in_breakable_cuda_graph,
    new_graph_pool,
    register_break_op,
    unregister_break_op,
)

pytestmark = pytest.mark.gpu

_LIBRARY = torch.library.Library("cudagraph_breakable_gpu_test", "DEF")
_LIBRARY.define("normalize_into(Tensor x, Tensor(a!) output) -> ()")
_LIBRARY.define("normalize(Tensor x) -> Tensor")


def normalize_into(x: torch.Tensor, output: torch.Tensor) -> None:
    """Caller-provided output: ``output = x / (max|x| + 1)``, with the max read on the host."""
    output.copy_(x / (x.abs().max().item() + 1.0))


def normalize(x: torch.Tensor) -> torch.Tensor:
    """Returns a new tensor: the primitive copies it back into the captured buffer at replay."""
    return x / (x.abs().max().item() + 1.0)


_LIBRARY.impl("normalize_into", normalize_into, "CompositeExplicitAutograd")
_LIBRARY.impl("normalize", normalize, "CompositeExplicitAutograd")
NORMALIZE_INTO_OP = torch.ops.cudagraph_breakable_gpu_test.normalize_into
NORMALIZE_OP = torch.ops.cudagraph_breakable_gpu_test.normalize


@pytest.fixture(autouse=True)
def break_ops_registered():
    register_break_op(NORMALIZE_INTO_OP)
    register_break_op(NORMALIZE_OP)
    yield
    unregister_break_op(NORMALIZE_INTO_OP)
    unregister_break_op(NORMALIZE_OP)


normalize_into_decorated = eager_break(normalize_into)
normalize_decorated = eager_break(normalize)

# Each break source, in both output conventions: (name, how the forward calls the break).
BREAKS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}


def _into(call: Callable[[torch.Tensor, torch.Tensor], object]) -> Callable[[torch.Tensor], torch.Tensor]:
    def run(x: torch.Tensor) -> torch.Tensor:
        output = torch.empty_like(x)
        call(x, output)
        return output

    return run


BREAKS["explicit-into"] = _into(lambda x, out: add_eager(normalize_into, x, out))
BREAKS["explicit-copy-back"] = lambda x: add_eager(normalize, x)
BREAKS["decorator-into"] = _into(normalize_into_decorated)
BREAKS["decorator-copy-back"] = normalize_decorated
BREAKS["operator-into"] = _into(NORMALIZE_INTO_OP)
BREAKS["operator-copy-back"] = NORMALIZE_OP


def chain(x: torch.Tensor, weight: torch.Tensor, breaks: list[Callable[[torch.Tensor], torch.Tensor]]) -> torch.Tensor:
    """matmul, sin, [break], affine, [break], ... tanh, matmul: one break after each stage."""
    h = (x @ weight).sin()
    for index, breaker in enumerate(breaks):
        h = breaker(h)
        h = h * (1.5 + index) + 0.25
    return h.tanh() @ weight


def capture_and_compare(
    forward: Callable[[torch.Tensor], torch.Tensor], options: CaptureOptions | None = None
) -> BreakableCUDAGraph:
    """Capture ``forward`` on a static input, then check replay == eager on three fresh inputs."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    static_x = torch.randn(16, 64, device="cuda", generator=generator)
    graph = BreakableCUDAGraph(pool=new_graph_pool(), options=options)
    with graph.capture():
        assert is_in_breakable_cuda_graph()
        static_out = forward(static_x)
    assert not is_in_breakable_cuda_graph()
    for _ in range(3):
        fresh = torch.randn(16, 64, device="cuda", generator=generator) * 3
        expected = forward(fresh)
        static_x.copy_(fresh)
        graph.replay()
        assert torch.equal(static_out, expected), (static_out - expected).abs().max()
    return graph


@pytest.fixture(scope="module")
def weight() -> torch.Tensor:
    return torch.randn(64, 64, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1)) / 8


@pytest.mark.parametrize("source", list(BREAKS))
def test_one_break_each_source_and_convention(source: str, weight: torch.Tensor) -> None:
    graph = capture_and_compare(lambda x: chain(x, weight, [BREAKS[source]]))
    assert (graph.num_segments, graph.num_eager_calls) == (2, 1)
    copies_back = source.endswith("copy-back")
    assert bool(graph.eager_calls[0].copy_back) is copies_back


@pytest.mark.parametrize("op_name", ["operator-into", "operator-copy-back"])
def test_a_bound_break_replays_its_bound_callable_not_the_op(op_name: str, weight: torch.Tensor) -> None:
    """With a replay binder, replay calls what the binder returned (the same Python function, no dispatch): still
    equal to eager on fresh inputs, and the op is never dispatched at replay."""
    op, function = (NORMALIZE_INTO_OP, normalize_into) if op_name == "operator-into" else (NORMALIZE_OP, normalize)
    bound_calls = []

    def binder(*args: torch.Tensor):
        def bound():
            bound_calls.append(op_name)
            return function(*args)

        return bound

    register_break_op(op, replay_binder=binder)
    graph = capture_and_compare(lambda x: chain(x, weight, [BREAKS[op_name]] * 2))
    assert graph.num_eager_calls == 2 and all(call.bound is not None for call in graph.eager_calls)
    assert len(bound_calls) == 3 * 2, "three replays of two bound breaks"
    counter = _OpCounter()
    with counter:
        graph.replay()
    assert counter.calls[str(op)] == 0 and len(bound_calls) == 4 * 2
    assert counter.calls["aten.div"] == 2, "the bound breaks ran their own ops"


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("breaks", [0, 1, 5])
def test_zero_one_and_many_breaks(breaks: int, weight: torch.Tensor) -> None:
    mixed = [BREAKS[name] for name in BREAKS]
    graph = capture_and_compare(lambda x: chain(x, weight, [mixed[i % len(mixed)] for i in range(breaks)]))
    assert (graph.num_segments, graph.num_eager_calls) == (breaks + 1, breaks)


def test_adjacent_breaks_keep_no_empty_segment(weight: torch.Tensor) -> None:
    def forward(x: torch.Tensor) -> torch.Tensor:
        h = add_eager(normalize, x)  # nothing recorded before it: the first segment is empty
        h = add_eager(normalize, h)  # nothing between the two breaks either
        return chain(h, weight, [])

    graph = capture_and_compare(forward)
    assert (graph.num_segments, graph.num_eager_calls) == (1, 2)


def test_side_stream_joined_inside_a_segment(weight: torch.Tensor) -> None:
    side = torch.cuda.Stream()

    def forward(x: torch.Tensor) -> torch.Tensor:
        h = x @ weight
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            branch = (h * 2).cos()
        torch.cuda.current_stream().wait_stream(side)
        h = h + branch
        h = add_eager(normalize, h)
        return h.sin() @ weight

    graph = capture_and_compare(forward)
    assert (graph.num_segments, graph.num_eager_calls) == (2, 1)


def test_unjoined_side_stream_at_a_break_names_the_stream(weight: torch.Tensor) -> None:
    side = torch.cuda.Stream()
    static_x = torch.randn(16, 64, device="cuda")

    def forward(x: torch.Tensor) -> torch.Tensor:
        h = x @ weight
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            (h * 2).cos()  # forked, never joined back
        return add_eager(normalize, h)

    graph = BreakableCUDAGraph(pool=new_graph_pool())
    with pytest.raises(BreakableCaptureError, match="not joined") as raised, graph.capture():
        forward(static_x)
    assert f"{side.cuda_stream:#x}" in str(raised.value) or str(side.cuda_stream) in str(raised.value)
    assert graph.num_segments == 0 and not graph.captured
    capture_and_compare(lambda x: chain(x, weight, [BREAKS["explicit-into"]]))  # the next capture works


def test_nested_capture_is_an_error(weight: torch.Tensor) -> None:
    outer = BreakableCUDAGraph(pool=new_graph_pool())
    inner = BreakableCUDAGraph(pool=outer.pool)
    static_x = torch.randn(16, 64, device="cuda")
    with pytest.raises(BreakableCaptureError, match="nested captures are not supported"), outer.capture():
        static_x @ weight
        with inner.capture():
            pass
    assert not outer.captured and not inner.captured
    capture_and_compare(lambda x: chain(x, weight, [BREAKS["operator-into"]]))


def test_force_split_makes_a_segment_without_eager_work(weight: torch.Tensor) -> None:
    def forward(x: torch.Tensor) -> torch.Tensor:
        h = (x @ weight).sin()
        force_split()
        return h.tanh() @ weight

    graph = capture_and_compare(forward)
    assert (graph.num_segments, graph.num_eager_calls) == (2, 0)


def test_split_every_op_replays_exactly(weight: torch.Tensor) -> None:
    graph = capture_and_compare(
        lambda x: chain(x, weight, [BREAKS["operator-copy-back"]]), CaptureOptions(split_every_op=True)
    )
    assert graph.num_eager_calls == 1
    assert graph.num_segments >= 6  # matmul, sin, mul, add, tanh, matmul: one segment each


def test_capture_stub_runs_at_capture_only(weight: torch.Tensor) -> None:
    calls = {"stub": 0, "real": 0}

    def stub(x: torch.Tensor, output: torch.Tensor) -> None:
        calls["stub"] += 1
        output.zero_()

    @eager_break(capture_stub=stub)
    def real(x: torch.Tensor, output: torch.Tensor) -> None:
        calls["real"] += 1
        normalize_into(x, output)

    graph = capture_and_compare(lambda x: chain(x, weight, [_into(real)]))
    # capture: the stub once; the comparison runs the forward eagerly 3 times and replays 3 times.
    assert calls == {"stub": 1, "real": 6}
    assert graph.num_eager_calls == 1


def test_barrier_runs_before_each_eager_break_at_capture(weight: torch.Tensor) -> None:
    barriers: list[int] = []
    graph = capture_and_compare(
        lambda x: chain(x, weight, [BREAKS["explicit-into"], BREAKS["operator-copy-back"]]),
        CaptureOptions(barrier=lambda: barriers.append(len(barriers))),
    )
    assert barriers == [0, 1]
    graph.replay()
    assert barriers == [0, 1]


def test_debug_mode_catches_a_moved_argument() -> None:
    cache = torch.zeros(16, 64, device="cuda")
    static_x = torch.randn(16, 64, device="cuda")
    graph = BreakableCUDAGraph(pool=new_graph_pool(), options=CaptureOptions(debug=True))
    with graph.capture():
        h = static_x * 2
        add_eager(normalize_into, h, cache)
        (cache + 1).sum()
    graph.replay()  # addresses unchanged: fine
    cache.set_(torch.zeros(16, 64, device="cuda"))  # the eager argument now lives elsewhere
    with pytest.raises(BreakableCaptureError, match="argument 1 was at"):
        graph.replay()


def test_captures_share_one_pool(weight: torch.Tensor) -> None:
    def big_forward(x: torch.Tensor) -> torch.Tensor:
        h = x.repeat(64, 16).sin()  # [1024, 1024] fp32 intermediates: 4 MiB each
        normalized = torch.empty_like(h)
        add_eager(normalize_into, h, normalized)
        return (normalized * 2).sum(dim=0)

    static_x = torch.randn(16, 64, device="cuda")

    def reserved_by_capture(pool) -> tuple[int, BreakableCUDAGraph]:
        torch.cuda.synchronize()
        before = torch.cuda.memory_reserved()
        graph = BreakableCUDAGraph(pool=pool)
        with graph.capture():
            big_forward(static_x)
        torch.cuda.synchronize()
        return torch.cuda.memory_reserved() - before, graph

    shared_pool = new_graph_pool()
    first_bytes, first = reserved_by_capture(shared_pool)
    shared_bytes, second = reserved_by_capture(shared_pool)
    private_bytes, third = reserved_by_capture(new_graph_pool())
    print(
        f"\npool sharing: first capture {first_bytes} B, second in the same pool {shared_bytes} B, "
        f"in a private pool {private_bytes} B"
    )
    assert first_bytes > 0 and shared_bytes < private_bytes
    for graph in (first, second, third):
        graph.replay()
        graph.reset()


def test_reset_returns_the_pool_memory(weight: torch.Tensor) -> None:
    static_x = torch.randn(16, 64, device="cuda")
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    with breakable_capture(pool=new_graph_pool()) as graph:
        big = static_x.repeat(64, 16).sin()
        add_eager(normalize_into, big, torch.empty_like(big))
    assert torch.cuda.memory_reserved() > before
    graph.replay()
    graph.reset()
    del big
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == before
