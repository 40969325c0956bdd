import torch
from mr_plugin.model_runner import CountingModelRunner, decode_graphs_of
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.server_args import ServerArgs


def test_sglang_calls_the_override_when_it_initialises():
    runner = CountingModelRunner(ServerArgs(cuda_graph_bs=[1, 2]))
    runner.initialize()
    assert runner.decode_graph_count == 2
    assert runner.graph_summary() == {"decode_batch_sizes": [1, 2], "prefill_token_counts": [16, 32, 64]}


def test_decode_runs_from_the_graphs_it_counted():
    runner = CountingModelRunner(ServerArgs(cuda_graph_bs=[1, 2]))
    runner.initialize()
    assert runner.forward_decode(ForwardBatch(input_ids=torch.tensor([3]))).tolist() == [6]
    assert decode_graphs_of(runner).graphs[1].replays == 1


def test_disabled_graphs_count_zero():
    runner = CountingModelRunner(ServerArgs(disable_cuda_graph=True, disable_piecewise_cuda_graph=True))
    runner.initialize()
    assert runner.decode_graph_count == 0 and decode_graphs_of(runner) is None
    assert runner.graph_summary() == {"decode_batch_sizes": [], "prefill_token_counts": []}
