"""The vocabulary-parallel head's gather as properties, with ``N`` ranks simulated in one process (the all-gather
stacks every rank's slice of a known logits matrix): for any row count, group size and vocabulary (the last rank
padded), the gathered logits are the single-rank ones in float32, whether gathered into the shared
``VocabGatherBuffer`` or into memory of their own; every step of up to the reserved rows gathers at the buffer's one
address, a larger step elsewhere; growing the buffer keeps the outgrown one until it is released. The gloo test of
the whole sharded engine with graphs is ``tests/engine/test_engine_tensor_parallel.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from cudagraph.engine.model import ShardPlan, model_config_from_preset, random_model
from cudagraph.engine.model.collectives import (
    VocabGatherBuffer,
    all_gather_into_,
    gather_vocab_logits,
    register_communicator,
    unregister_communicator,
)

GROUP = "simulated-vocab-group"


class KnownSlicesCommunicator:
    """``world_size`` ranks whose logits slices are known: an all-gather checks that this rank sent its own slice and
    writes every rank's, in rank order, where it was asked to (recording the address)."""

    def __init__(self, slices: torch.Tensor, rank: int) -> None:
        self.slices = slices  # [world, N, vocab_per_rank]
        self.rank = rank
        self.world_size = slices.shape[0]
        self.written_at: list[int] = []

    def all_reduce_(self, tensor: torch.Tensor) -> None:
        raise AssertionError("the head does not all-reduce")

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        gathered = tensor.new_empty((self.world_size, *tensor.shape))
        self.all_gather_into(gathered, tensor)
        return gathered

    def all_gather_into(self, out: torch.Tensor, tensor: torch.Tensor) -> None:
        assert torch.equal(tensor, self.slices[self.rank, : tensor.shape[0]]), "a rank sent another rank's slice"
        self.written_at.append(out.data_ptr())
        out.copy_(self.slices[:, : tensor.shape[0]])

    def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the head does not exchange tokens")


@pytest.fixture
def group() -> Iterator[str]:
    yield GROUP
    unregister_communicator(GROUP)


def sharded(full: torch.Tensor, world: int) -> torch.Tensor:
    """``full`` ``[N, vocab]`` split by vocabulary columns into ``[world, N, vocab_per_rank]``, the last rank padded
    with zero columns (as a padded head's zero rows give)."""
    rows, vocab = full.shape
    per_rank = -(-vocab // world)
    padded = torch.zeros(rows, world * per_rank, dtype=full.dtype)
    padded[:, :vocab] = full
    return padded.view(rows, world, per_rank).permute(1, 0, 2).contiguous()


@given(
    rows=st.integers(0, 9),
    world=st.integers(1, 4),
    vocab=st.integers(1, 40),
    rank=st.integers(0, 3),
    reserved=st.sampled_from([None, 0, 3, 9]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_gathered_logits_are_the_single_rank_ones_in_float32(
    rows: int, world: int, vocab: int, rank: int, reserved: int | None, dtype: torch.dtype
) -> None:
    rank %= world
    full = torch.randn(rows, vocab).to(dtype)
    slices = sharded(full, world)
    communicator = KnownSlicesCommunicator(slices, rank)
    register_communicator(GROUP, communicator)
    try:
        buffer = None
        if reserved is not None:
            buffer = VocabGatherBuffer(world, slices.shape[-1], dtype, "cpu")
            buffer.reserve(reserved)
        logits = gather_vocab_logits(slices[rank].clone(), GROUP, vocab, buffer)
    finally:
        unregister_communicator(GROUP)
    assert logits.dtype == torch.float32 and logits.shape == (rows, vocab)
    assert torch.equal(logits, full.float())
    if buffer is not None and 0 < rows <= buffer.rows:
        assert communicator.written_at == [buffer.data_ptr()]
    elif buffer is not None and rows > buffer.rows:
        assert communicator.written_at != [buffer.data_ptr()]


def test_every_step_up_to_the_reserved_rows_gathers_at_one_address(group: str) -> None:
    world, per_rank, vocab = 2, 5, 9
    full = torch.randn(8, vocab)
    slices = sharded(full, world)
    communicator = KnownSlicesCommunicator(slices, rank=1)
    register_communicator(group, communicator)
    buffer = VocabGatherBuffer(world, per_rank, torch.float32, "cpu")
    buffer.reserve(4)
    for rows in (4, 3, 2, 1):  # the buckets of a capture, largest first
        assert torch.equal(gather_vocab_logits(slices[1, :rows].clone(), group, vocab, buffer), full[:rows])
    assert communicator.written_at == [buffer.data_ptr()] * 4
    gather_vocab_logits(slices[1, :8].clone(), group, vocab, buffer)  # an eager step larger than any graph
    assert communicator.written_at[-1] != buffer.data_ptr() and buffer.rows == 4


def test_growing_keeps_the_outgrown_buffer_until_released() -> None:
    buffer = VocabGatherBuffer(world_size=2, vocab_per_rank=8, dtype=torch.float32, device="cpu")
    assert buffer.rows == 0 and buffer.nbytes == 0
    buffer.reserve(4)
    first, held = buffer.data_ptr(), buffer.nbytes
    assert held == 4 * 2 * 8 * 4
    buffer.reserve(2)  # room already: nothing moves
    assert (buffer.data_ptr(), buffer.nbytes) == (first, held)
    buffer.reserve(16)  # verify graphs after decode ones: k + 1 rows a request
    assert buffer.rows == 16 and buffer.data_ptr() != first
    assert buffer.nbytes == held + 16 * 2 * 8 * 4, "the graphs captured over the old buffer still read it"
    buffer.release_outgrown()
    assert buffer.nbytes == 16 * 2 * 8 * 4


def test_the_gather_op_names_the_shape_it_writes(group: str) -> None:
    register_communicator(group, KnownSlicesCommunicator(torch.zeros(2, 3, 4), rank=0))
    with pytest.raises(ValueError, match=r"contiguous torch.float32 tensor of shape \(2, 3, 4\).*\(3, 2, 4\)"):
        all_gather_into_(torch.empty(3, 2, 4), torch.zeros(3, 4), group)
    with pytest.raises(ValueError, match="non-contiguous"):
        all_gather_into_(torch.empty(3, 2, 4).transpose(0, 1), torch.zeros(3, 4), group)


def test_a_sharded_model_holds_one_gather_buffer_and_a_single_rank_none() -> None:
    config = model_config_from_preset("tiny-llama-random")
    assert random_model(config).logits_gather is None
    shard = random_model(config, shard=ShardPlan(1, 2, GROUP))
    assert shard.logits_gather is not None and shard.logits_gather.rows == 0
    shard.reserve_logits_rows(6)
    assert shard.logits_gather.rows == 6
    assert shard.logits_gather.destination(6).shape == (2, 6, ShardPlan(1, 2, GROUP).vocab_per_rank(config))
    assert shard.logits_gather.dtype == shard.dtype
