import gc

from draft_plugin.draft_runner import DraftCudaGraphRunner
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs


def test_capture_runs_in_capture_mode_with_gc_frozen_and_leaves_it():
    runner = DraftCudaGraphRunner(ModelRunner(ServerArgs(cuda_graph_bs=[1, 8])))
    assert runner.capture() == [True, True]
    assert gc.get_freeze_count() == 0


def test_the_shared_pool_can_be_released():
    assert DraftCudaGraphRunner.release_pool() is None
