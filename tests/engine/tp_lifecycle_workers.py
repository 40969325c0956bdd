"""Rank functions for the tensor-parallel lifecycle tests (a module of their own so ``spawn`` can import them)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from stubs import StubAttention
from tp_workers import join

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.backend_utils import CaptureOptions
from cudagraph.config import Backend, CapturePolicy, CudaGraphConfig, PhaseConfig
from cudagraph.engine.distributed import shutdown_tensor_parallel
from cudagraph.runner import DecodeCudaGraphRunner, ForwardBatch, ForwardMode

LAZY = CudaGraphConfig(
    decode=PhaseConfig(Backend.FULL, (1, 2, 4, 8), 8, capture_policy=CapturePolicy.LAZY),
    prefill=PhaseConfig(Backend.BREAKABLE, (16,), 16),
)
STEP_SIZES = (3, 1, 3, 8, 2)


class LookupModelRunner:
    """A model of one lookup whose rows the ranks all-reduce (as a sharded model's output is)."""

    device = torch.device("cpu")
    dtype = torch.float32

    def __init__(self) -> None:
        self.table = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
        self.attn_backend = StubAttention()
        self.req_to_token_pool = SimpleNamespace(req_to_token=torch.zeros(16, 8, dtype=torch.int32))

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        return self.table.index_select(0, batch.input_ids) + batch.positions[:, None].float()


def decode_step(size: int, seed: int) -> ForwardBatch:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 32, (size,), generator=generator)
    positions = torch.randint(0, 50, (size,), generator=generator)
    seq_lens = (positions + 1).int()
    rows = torch.arange(1, size + 1)
    return ForwardBatch(ForwardMode.DECODE, size, ids, positions, seq_lens, rows, rows.clone(), int(seq_lens.sum()))


def lazy_capture_on_rank(
    rank: int, world_size: int, init_method: str, payload: tuple[list[list[int]], bool]
) -> list[dict[str, Any]] | None:
    """Each rank runs the same steps under the lazy policy, rank ``r`` running out of memory capturing the buckets
    ``out_of_memory[r]``; through the group's agreement when ``agree``. Rank 0 returns every rank's captured
    buckets, skip reasons, and whether each step's logits equalled the eager ones."""
    out_of_memory, agree = payload
    group = join(rank, world_size, init_method)
    try:
        barrier = group.capture_barrier if agree else group.barrier
        model_runner = LookupModelRunner()
        backend = CpuReplayBackend(
            Backend.FULL, options=CaptureOptions(barrier=barrier), out_of_memory_shapes=out_of_memory[rank]
        )
        runner = DecodeCudaGraphRunner(model_runner, LAZY, backend=backend, show_progress=False)
        runner.capture()
        equal = []
        for step, size in enumerate(STEP_SIZES):
            batch = decode_step(size, step)
            eager = model_runner.forward(batch).clone()
            equal.append(bool(torch.equal(runner.replay(batch), eager)))
        mine = {
            "captured": list(runner.captured_buckets),
            "skipped": dict(runner.skipped_buckets),
            "equal": equal,
            "lazy_captures": runner.metrics.lazy_captures,
        }
        runner.shutdown()
        everyone: list[Any] = [None] * world_size
        dist.all_gather_object(everyone, mine, group=group.cpu_group)
    finally:
        shutdown_tensor_parallel(group)
    return everyone if rank == 0 else None
