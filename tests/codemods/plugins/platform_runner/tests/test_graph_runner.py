from npu_plugin.graph_runner import NPUGraphRunner
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs


def test_every_batch_size_is_captured_on_the_platform_and_replays():
    runner = NPUGraphRunner(ModelRunner(ServerArgs(cuda_graph_bs=[1, 2, 4])))
    runner.capture()
    assert sorted(runner.graphs) == [1, 2, 4] and runner.captured_on_platform()
    assert runner.replay(2) == [2.0, 2.0] and runner.graphs[2]["replays"] == 1
