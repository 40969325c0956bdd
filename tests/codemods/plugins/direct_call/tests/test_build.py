import gc

import torch
from direct_plugin.build import build_graph_runner
from direct_plugin.capture_guard import StepStats, warm_up
from sglang.srt.model_executor.cuda_graph_runner import model_capture_mode
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs


class _RecordingModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stats = StepStats()

    def forward(self, input_ids):
        self.stats.record(input_ids)
        return input_ids + 1


def test_the_built_runner_replays_every_captured_batch_size():
    runner = build_graph_runner(ModelRunner(ServerArgs(cuda_graph_bs=[1, 3])))
    assert sorted(runner.graphs) == [1, 3]
    assert runner.replay(ForwardBatch(input_ids=torch.tensor([4, 5]))).tolist() == [8, 10]


def test_no_runner_with_graphs_disabled():
    assert build_graph_runner(ModelRunner(ServerArgs(disable_cuda_graph=True))) is None


def test_the_guard_follows_the_capture_mode():
    stats = StepStats()
    with model_capture_mode():
        assert stats.record(torch.zeros(3)) is False
    assert stats.record(torch.zeros(3)) is True and stats.tokens_seen == [3]


def test_the_stats_skip_the_capture_of_the_runner_the_plugin_builds():
    model = _RecordingModel()
    runner = build_graph_runner(ModelRunner(ServerArgs(cuda_graph_bs=[2]), model=model))
    assert model.stats.tokens_seen == []  # warm-up and capture both run in capture mode
    runner.replay(ForwardBatch(input_ids=torch.tensor([1])))
    assert model.stats.tokens_seen == [2]


def test_warm_up_freezes_the_collector_for_the_run_only():
    frozen = warm_up(lambda input_ids: gc.get_freeze_count() > 0, torch.zeros(1))
    assert frozen and gc.get_freeze_count() == 0
    assert warm_up(lambda input_ids: gc.get_freeze_count() > 0, torch.zeros(1), enable_cudagraph_gc=True) is False
