"""The bound graph replay on real graphs: the C++ call where torch's Python replay adds nothing, the public replay
where it would add something (an input-liveness tracker, a graph instantiated on its first replay), and the same
results either way."""

from __future__ import annotations

import functools
import inspect

import pytest
import torch

from cudagraph.backend_utils import graph_replay_fn
from cudagraph.backend_utils.replay import native_replay_refusal

pytestmark = pytest.mark.gpu


def _captured(**capture_options: bool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
    """A graph of ``output = input * 2 + 1``, captured on a side stream; ``keep_graph`` goes to the graph, the rest
    to ``capture_begin``."""
    keep_graph = capture_options.pop("keep_graph", False)
    static_input = torch.zeros(8, device="cuda")
    graph = torch.cuda.CUDAGraph(keep_graph=keep_graph)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin(**capture_options)
        static_output = static_input * 2 + 1
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    return graph, static_input, static_output


def _replays_right(replay: object, static_input: torch.Tensor, static_output: torch.Tensor) -> None:
    static_input.copy_(torch.arange(8.0, device="cuda"))
    replay()  # type: ignore[operator]
    torch.cuda.synchronize()
    assert torch.equal(static_output, torch.arange(8.0, device="cuda") * 2 + 1)


def test_a_plain_graph_is_bound_on_the_checked_torch_and_replays_right() -> None:
    graph, static_input, static_output = _captured()
    refusal = native_replay_refusal(graph)
    assert refusal is None, f"torch {torch.__version__}: {refusal}"
    replay = graph_replay_fn(graph)
    assert isinstance(replay, functools.partial)
    _replays_right(replay, static_input, static_output)


def test_a_tracked_graph_keeps_the_public_replay_and_replays_right() -> None:
    if "check_input_liveness" not in inspect.signature(torch.cuda.CUDAGraph.capture_begin).parameters:
        pytest.skip(f"torch {torch.__version__} has no input-liveness tracker")
    graph, static_input, static_output = _captured(check_input_liveness=True)
    assert graph_replay_fn(graph) == graph.replay
    _replays_right(graph_replay_fn(graph), static_input, static_output)


def test_a_kept_graph_replays_right_before_and_after_instantiation() -> None:
    graph, static_input, static_output = _captured(keep_graph=True)
    _replays_right(graph_replay_fn(graph), static_input, static_output)
    graph.instantiate()
    _replays_right(graph_replay_fn(graph), static_input, static_output)
