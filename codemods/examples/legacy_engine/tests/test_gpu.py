"""What needs a CUDA device: the real graph runners and non-owning tensor aliases."""

import pytest

from toy_engine import server_args
from toy_engine.model_runner import ToyModelRunner


@pytest.mark.gpu
def test_weak_ref_aliases_the_same_memory():
    import torch

    tensor = torch.arange(8, device="cuda")
    alias = ToyModelRunner(server_args.decode_only_config(), device="cuda").alias(tensor)
    assert alias.data_ptr() == tensor.data_ptr()
    assert torch.equal(alias, tensor)


@pytest.mark.gpu
def test_memory_pool_holds_a_cuda_pool_handle():
    import torch

    from toy_engine import capture_state

    handle = torch.cuda.graph_pool_handle()
    previous = capture_state.swap_memory_pool(handle)
    try:
        assert capture_state.swap_memory_pool(previous) == handle
    finally:
        capture_state.swap_memory_pool(previous)
