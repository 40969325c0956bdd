import gc

import pytest
import torch
from draft_plugin.draft_runner import EAGLEDraftCudaGraphRunner
from sglang.srt.model_executor.cuda_graph_runner import get_global_graph_memory_pool, set_global_graph_memory_pool
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs


@pytest.fixture(autouse=True)
def fresh_pool():
    set_global_graph_memory_pool(None)
    yield
    set_global_graph_memory_pool(None)


def _runner(**server_args):
    return EAGLEDraftCudaGraphRunner(ModelRunner(ServerArgs(cuda_graph_bs=[1, 2, 4], **server_args)))


def test_capture_runs_in_capture_mode_and_leaves_it():
    runner = _runner()
    assert runner.capture_log == [True, True, True]
    runner.replay(torch.tensor([1, 2]))
    assert runner.capture_log == [True, True, True, False]


def test_gc_is_frozen_during_capture_only_unless_asked_to_keep_running():
    frozen_during = []
    runner = _runner()
    runner.model_runner.model.forward = lambda input_ids: frozen_during.append(gc.get_freeze_count() > 0)
    runner.capture()
    runner.model_runner.server_args.enable_cudagraph_gc = True
    runner.capture()
    assert frozen_during == [True, True, True, False, False, False] and gc.get_freeze_count() == 0


def test_every_graph_shares_the_pool_the_process_publishes():
    runner = _runner()
    assert runner.graph_pools() == {get_global_graph_memory_pool()} != {None}


def test_a_pool_published_before_capture_is_reused():
    set_global_graph_memory_pool((0, 4242))
    assert _runner().graph_pools() == {(0, 4242)}


def test_a_replay_drafts_from_the_new_inputs():
    runner = _runner()
    assert runner.replay(torch.tensor([1, 2, 3, 4, 5, 6])).tolist() == [2, 4, 6, 8, 10, 12]
