"""The breakable test double replays like a graph: segment ops frozen at capture, registered break ops run again."""

from __future__ import annotations

import pytest
import torch

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.backend_utils import CaptureOptions, register_break_op, unregister_break_op

_LIBRARY = torch.library.Library("cudagraph_cpu_double_test", "DEF")
_LIBRARY.define("add_offset_(Tensor(a!) x) -> ()")
OFFSET = {"value": 1.0}
"""What the break op reads at call time, like attention reads the forward context."""


def _add_offset(x: torch.Tensor) -> None:
    x.add_(OFFSET["value"])


_LIBRARY.impl("add_offset_", _add_offset, "CompositeExplicitAutograd")
ADD_OFFSET = torch.ops.cudagraph_cpu_double_test.add_offset_


@pytest.fixture(autouse=True)
def offset_is_a_break() -> object:
    register_break_op(ADD_OFFSET)
    OFFSET["value"] = 1.0
    yield
    unregister_break_op(ADD_OFFSET)


def capture(forward, shape: int = 4) -> CpuReplayBackend:
    backend = CpuReplayBackend("breakable", options=CaptureOptions(num_warmups=0))
    with backend.capture_session():
        backend.capture_one(shape, forward)
    return backend


def test_segments_replay_on_new_inputs_and_breaks_read_their_state_at_replay() -> None:
    static_x = torch.zeros(4)
    scale = {"value": 2.0}

    def forward() -> torch.Tensor:
        h = static_x * scale["value"]  # a Python value: frozen at capture, as in a graph
        ADD_OFFSET(h)
        return h.sin()

    backend = capture(forward)
    tape = backend.entry(4).graph
    assert (tape.num_segments, tape.num_eager_calls) == (2, 1)
    static_x.copy_(torch.arange(4.0))
    scale["value"], OFFSET["value"] = 100.0, 5.0
    out = backend.replay(4)
    torch.testing.assert_close(out, (torch.arange(4.0) * 2.0 + 5.0).sin())


def test_a_host_sync_inside_a_segment_is_an_error() -> None:
    static_x = torch.ones(4)
    with pytest.raises(RuntimeError, match="illegal under CUDA stream capture"):
        capture(lambda: static_x * static_x.sum().item())


def test_full_double_reruns_the_forward_into_the_captured_output() -> None:
    static_x = torch.ones(3)
    backend = CpuReplayBackend("full", options=CaptureOptions(num_warmups=0))
    with backend.capture_session():
        captured = backend.capture_one(3, lambda: static_x * 3)
    static_x.fill_(2.0)
    assert backend.replay(3) is captured and captured.tolist() == [6.0, 6.0, 6.0]
