import pytest
import torch
from hook_platform.platform import GRAPH_RUNNERS, HookPlatform
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.platforms import activate_platform
from sglang.srt.server_args import ServerArgs


@pytest.fixture(autouse=True)
def _hook_platform():
    activate_platform(HookPlatform())
    yield
    activate_platform(None)


def test_the_engine_builds_the_platform_runner_from_the_model_runner_alone():
    model_runner = ModelRunner(ServerArgs(cuda_graph_bs=[1, 2]))
    model_runner.initialize()
    runner = model_runner.graph_runner
    assert isinstance(runner, HookPlatform().get_graph_runner_cls())
    assert sorted(runner.graphs) == [1, 2]
    batch = ForwardBatch(input_ids=torch.tensor([3]))
    assert model_runner.forward_decode(batch).tolist() == [6]


def test_every_listed_runner_class_builds_as_the_engine_builds_it():
    model_runner = ModelRunner(ServerArgs(cuda_graph_bs=[4]))
    for runner_cls in GRAPH_RUNNERS.values():
        assert sorted(runner_cls(model_runner).graphs) == [4]
