from direct_plugin.build import build_graph_runner, capturing_now
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs


def test_the_built_runner_replays_every_captured_batch_size():
    runner = build_graph_runner(ModelRunner(ServerArgs(cuda_graph_bs=[1, 3])))
    assert runner.can_run(3) and runner.replay(3) == [3.0, 3.0, 3.0]


def test_not_capturing_outside_a_capture():
    assert capturing_now() is False
