import torch
from rl_rollout.config import LAUNCHER, RolloutConfig, launch_command, server_args
from rl_rollout.worker import RolloutWorker, graphs_ready, update_weights
from sglang.srt.model_executor.forward_batch_info import ForwardBatch


def test_the_config_becomes_sglangs_flags():
    config = RolloutConfig(cuda_graph_max_bs=4, cuda_graph_bs=[1, 2, 4])
    assert launch_command(config) == [*LAUNCHER, "--cuda-graph-max-bs", "4", "--cuda-graph-bs", "1", "2", "4"]
    parsed = server_args(config)
    assert parsed.cuda_graph_max_bs == 4 and parsed.cuda_graph_bs == [1, 2, 4] and not parsed.disable_cuda_graph


def test_an_eager_rollout_disables_sglangs_graphs():
    assert server_args(RolloutConfig(disable_cuda_graph=True)).disable_cuda_graph


def test_the_worker_replays_graphs_and_recaptures_them_after_a_weight_update():
    worker = RolloutWorker(server_args(RolloutConfig(cuda_graph_bs=[1, 2])))
    assert graphs_ready(worker)
    before = worker.model_runner.graph_runner
    update_weights(worker)
    assert graphs_ready(worker) and worker.model_runner.graph_runner is not before
    assert worker.model_runner.forward_decode(ForwardBatch(input_ids=torch.tensor([5]))).tolist() == [10]


def test_an_eager_worker_has_no_graphs():
    worker = RolloutWorker(server_args(RolloutConfig(disable_cuda_graph=True)))
    assert not graphs_ready(worker)
