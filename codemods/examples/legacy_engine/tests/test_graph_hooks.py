"""The recording decode runner's hooks, on the runner's method names (its graphs mocked: no device needed)."""

from types import SimpleNamespace
from unittest import mock

from cudagraph.runner import DecodeCudaGraphRunner
from toy_engine import graph_hooks
from toy_engine.graph_hooks import RecordingDecodeRunner


def test_captures_and_lone_replays_are_recorded():
    runner: DecodeCudaGraphRunner = object.__new__(RecordingDecodeRunner)  # no model, no graphs
    with mock.patch("cudagraph.runner.DecodeCudaGraphRunner.capture_one_shape", return_value="graph"):
        assert runner.capture_one_shape(4) == "graph"
    with mock.patch.object(DecodeCudaGraphRunner, "replay_graph", return_value="logits") as replay:
        assert runner.replay_graph(shape=2) == "logits"
    replay.assert_called_once_with(2)
    assert runner.captured == [4] and runner.replayed == [2]


def test_a_step_is_routed_and_recorded():
    runner: DecodeCudaGraphRunner = object.__new__(RecordingDecodeRunner)  # no model, no graphs
    route = SimpleNamespace(bucket=8)
    with mock.patch.object(RecordingDecodeRunner, "route", return_value=route), mock.patch.object(
        DecodeCudaGraphRunner, "replay_routed", return_value="logits"
    ):
        assert graph_hooks.step(runner, batch="batch") == "logits"
    assert runner.stepped == [8]
