import torch
from fallback_plugin import replay_counter
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs


def test_the_counter_sees_the_replays_of_the_runner_the_engine_builds():
    undo = replay_counter.install()
    try:
        assert replay_counter.is_patched()
        model_runner = ModelRunner(ServerArgs(cuda_graph_bs=[1, 2]))
        model_runner.initialize()
        replay_counter.REPLAYS["count"] = 0
        for tokens in ([1], [1, 2], [3]):
            model_runner.forward_decode(ForwardBatch(input_ids=torch.tensor(tokens)))
    finally:
        undo()
    assert replay_counter.REPLAYS["count"] == 3
    assert not replay_counter.is_patched()
