import torch
from replay_hooks import hooks, registry
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs


def test_the_around_hook_sees_every_replay_of_the_engine_runner_and_its_device():
    undo = registry.install()
    try:
        model_runner = ModelRunner(ServerArgs(cuda_graph_bs=[1, 2]))
        model_runner.initialize()
        hooks.REPLAYS.clear()
        output = model_runner.forward_decode(ForwardBatch(input_ids=torch.tensor([1, 2])))
    finally:
        undo()
    assert output.tolist() == [2, 4]
    assert hooks.REPLAYS == [("cpu", 2)]


def test_the_private_patch_counts_each_graph_the_engine_captures():
    undo = hooks.patch_private_capture()
    try:
        hooks.CAPTURES.clear()
        model_runner = ModelRunner(ServerArgs(cuda_graph_bs=[1, 2, 4]))
        model_runner.initialize()
    finally:
        undo()
    assert hooks.CAPTURES.count("_create_device_graph") == 3
    assert hooks.CAPTURES.count("_capture_graph") == 3
