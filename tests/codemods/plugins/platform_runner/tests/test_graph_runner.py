import torch
from npu_plugin.graph_runner import NPUGraphRunner
from npu_plugin.npu import NPUGraph
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs


def _runner(**server_args):
    return NPUGraphRunner(ModelRunner(ServerArgs(cuda_graph_bs=[1, 2, 4], **server_args)))


def test_every_batch_size_is_captured_as_a_platform_graph():
    runner = _runner()
    assert runner.captured_batch_sizes() == [1, 2, 4]
    assert all(graph.auto_dispatch_capture and graph.spec_info is None for graph in runner.graphs.values())


def test_the_platform_cache_location_dtype_is_used():
    assert _runner().out_cache_loc.dtype == torch.int32


def test_a_replay_pads_to_the_next_captured_size_and_sees_the_new_inputs():
    runner = _runner()
    output = runner.replay(ForwardBatch(input_ids=torch.tensor([5, 6, 7])))
    assert output.tolist() == [10, 12, 14] and runner.graphs[4].replays == 1


def test_a_batch_asking_for_hidden_states_recaptures_once():
    runner = _runner()
    first = runner.graphs[2]
    runner.replay(ForwardBatch(input_ids=torch.tensor([1, 2]), capture_hidden_mode=CaptureHiddenMode.FULL))
    runner.replay(ForwardBatch(input_ids=torch.tensor([1, 2]), capture_hidden_mode=CaptureHiddenMode.FULL))
    assert runner.graphs[2] is not first and isinstance(runner.graphs[2], NPUGraph)
    assert runner.graphs[2].replays == 2


def test_speculative_graphs_carry_their_spec_info():
    runner = _runner(speculative_algorithm="EAGLE")
    assert runner.graphs[4].spec_info == {"algorithm": "EAGLE", "num_tokens": 4}
