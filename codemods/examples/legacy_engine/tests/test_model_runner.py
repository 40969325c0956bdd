"""The toy model runner's graph-runner attributes and methods."""

from unittest import mock

from toy_engine import model_runner as model_runner_module
from toy_engine import server_args
from toy_engine.forward_context import ForwardContext as EngineForwardContext
from toy_engine.model_runner import ToyModelRunner, graph_runner_of


def test_decode_batch_sizes_come_from_the_config():
    runner = ToyModelRunner(server_args.decode_only_config())
    assert runner.decode_batch_sizes() == [1, 2, 4]
    assert runner.capture_all() == [4, 2, 1]


def test_graph_runners_stay_unset_without_cuda():
    runner = ToyModelRunner(server_args.decode_only_config())
    with mock.patch.object(model_runner_module, "_cuda_available", return_value=False):
        runner.init_device_graphs()
        runner.init_piecewise_cuda_graphs()
    assert runner.graph_runner is None and runner.piecewise_cuda_graph_runner is None
    assert graph_runner_of(runner) is None


def test_capture_one_batch_size_can_be_patched_by_name():
    runner = ToyModelRunner(server_args.decode_only_config())
    with mock.patch.object(ToyModelRunner, "capture_one_batch_size", return_value=-1) as patched:
        runner.capture_all()
    assert patched.call_count == 3


def test_the_engine_keeps_its_own_forward_context():
    runner = ToyModelRunner(server_args.decode_only_config())
    assert isinstance(runner.engine_context(), EngineForwardContext)
    assert not runner.in_breakable_graph()
    assert isinstance(runner.breakable_graph_type(), type)
    assert isinstance(ToyModelRunner.capture_failed_message(), str)


def test_the_runner_classes_resolve():
    from cudagraph.legacy.cuda_graph_runner import CudaGraphRunner, PiecewiseCudaGraphRunner

    assert CudaGraphRunner.phase == "decode" and PiecewiseCudaGraphRunner.phase == "prefill"


def test_the_breakable_runner_graphs_prefill():
    from cudagraph.legacy.cuda_graph_runner import BreakableCudaGraphRunner

    assert BreakableCudaGraphRunner.phase == "prefill"


def test_only_tc_piecewise_prefill_compiles():
    assert ToyModelRunner(server_args.tc_piecewise_prefill_config()).prefill_compiles()
    assert not ToyModelRunner(server_args.breakable_prefill_config()).prefill_compiles()


@mock.patch("cudagraph.legacy.cuda_graph_runner.get_batch_sizes_to_capture", return_value=[8])
def test_patching_by_dotted_path_reaches_the_runner(patched):
    from cudagraph.legacy import cuda_graph_runner

    assert cuda_graph_runner.get_batch_sizes_to_capture(None) == [8]
