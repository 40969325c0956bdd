from mr_plugin.model_runner import CountingModelRunner, decode_graphs_of
from sglang.srt.server_args import ServerArgs


def test_graphs_are_counted_and_reachable():
    runner = CountingModelRunner(ServerArgs(cuda_graph_bs=[1, 2]))
    runner.init_device_graphs()
    assert runner.graph_count == 2 and decode_graphs_of(runner).can_run(2)


def test_disabled_graphs_count_zero():
    runner = CountingModelRunner(ServerArgs(disable_cuda_graph=True))
    runner.init_device_graphs()
    assert runner.graph_count == 0 and decode_graphs_of(runner) is None
