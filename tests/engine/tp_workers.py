"""Rank functions for the tensor-parallel tests (a module of their own so ``spawn`` can import them by name)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist

from cudagraph.backend.testing import CpuReplayBackend, SimulatedDeviceMemory
from cudagraph.backend_utils import CaptureOptions
from cudagraph.config import Backend, CudaGraphConfig, MemoryBudget, Phase, PhaseConfig, resolve
from cudagraph.engine.batch import SamplingParams
from cudagraph.engine.distributed import (
    DrivingModelRunner,
    GroupOptions,
    StepBroadcaster,
    follow,
    init_tensor_parallel,
    shutdown_tensor_parallel,
)
from cudagraph.engine.generate import generate
from cudagraph.engine.model import ModelConfig, model_config_from_preset, random_model, reference_logits
from cudagraph.engine.model.collectives import register_communicator
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.engine.testing import GatherRecorder
from cudagraph.runner import DecodeCudaGraphRunner

PROMPTS = ([1, 2, 3], [7, 300, 11, 45, 2, 9], [500], [64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74])
NEW_TOKENS = 8
TIMEOUT_S = 20.0
EAGER = resolve(decode_disable_cuda_graph=True, prefill_disable_cuda_graph=True)


def join(rank: int, world_size: int, init_method: str, timeout_s: float = TIMEOUT_S):
    return init_tensor_parallel(GroupOptions(rank, world_size, torch.device("cpu"), init_method, timeout_s))


def cache_config(page_size: int) -> CacheConfig:
    """The KV cache every tensor-parallel CPU test runs with, in pages of ``page_size`` tokens."""
    return CacheConfig(max_num_reqs=8, max_context_len=64, page_size=page_size)


def config_of(model: str | ModelConfig) -> ModelConfig:
    """A preset's config, or the config given (a preset with more heads, for sizes its own heads cannot take)."""
    return model if isinstance(model, ModelConfig) else model_config_from_preset(model)


def model_outputs(
    rank: int, world_size: int, init_method: str, payload: tuple[str | ModelConfig, int, str]
) -> dict[str, Any] | None:
    """Rank 0: the engine's greedy tokens (rank 0 driving, the others following, over a KV cache of
    ``page_size``-token pages with the ``kernel_backend`` kernel set) and dense logits per prompt."""
    preset, page_size, kernel_backend = payload
    group = join(rank, world_size, init_method)
    group.choose_all_reduce("auto", torch.float32, 64 * 64)
    model = random_model(config_of(preset), seed=5, shard=group.shard_plan())
    logits = [reference_logits(model, prompt) for prompt in PROMPTS]
    cache = cache_config(page_size)
    broadcaster = StepBroadcaster(group)
    params = SamplingParams(max_new_tokens=NEW_TOKENS)
    tokens = None
    if rank == 0:
        driver = DrivingModelRunner(
            model, EAGER, cache_config=cache, kernel_backend=kernel_backend, broadcaster=broadcaster
        )
        try:
            tokens = [out.output_token_ids for out in generate(driver, [list(p) for p in PROMPTS], params)]
        finally:
            broadcaster.stop()
    else:
        follow(ModelRunner(model, EAGER, cache_config=cache, kernel_backend=kernel_backend), broadcaster)
    shutdown_tensor_parallel(group)
    if rank != 0:
        return None
    return {"tokens": tokens, "logits": logits, "initialized_after": dist.is_initialized()}


A2A_DECODE_BUCKETS = (1, 2, 4)


def moe_a2a_outputs(rank: int, world_size: int, init_method: str, payload: tuple[str, str]) -> dict[str, Any] | None:
    """Rank 0: greedy tokens, dense logits, the decode batch sizes that replayed and each captured decode bucket's
    eager breaks (all, and ``all_to_all`` ones; none in a full capture) of the sharded MoE model whose sparse
    blocks exchange tokens (``moe_a2a_backend="all_to_all"``), run eagerly (``decode`` ``disabled``) or replaying
    the CPU double of ``decode`` (``full`` or ``breakable``). Every rank runs the same greedy steps in lock step (no
    driver: the logits are replicated)."""
    preset, decode = payload
    group = join(rank, world_size, init_method)
    try:
        group.choose_all_reduce("auto", torch.float32, 64 * 64)
        model = random_model(model_config_from_preset(preset), seed=5, shard=group.shard_plan("all_to_all"))
        logits = [reference_logits(model, prompt) for prompt in PROMPTS]
        backend = Backend(decode)
        graphs = CudaGraphConfig(
            decode=PhaseConfig(backend, () if backend is Backend.DISABLED else A2A_DECODE_BUCKETS, 4),
            prefill=PhaseConfig(Backend.DISABLED, (), 0),
        )
        engine = ModelRunner(
            model, graphs, cache_config=cache_config(1), kernel_backend="torch", capture_barrier=group.capture_barrier
        )
        breaks: dict[int, dict[str, int]] = {}
        if backend is not Backend.DISABLED:
            double = CpuReplayBackend(backend, options=CaptureOptions(barrier=group.capture_barrier))
            runner = DecodeCudaGraphRunner(
                engine, graphs, backend=double, show_progress=False, capture_barrier=group.capture_barrier
            )
            runner.capture()
            engine.decode_cuda_graph_runner = runner
            tapes = {bucket: double.entry(bucket).graph for bucket in runner.captured_buckets}
            for bucket, tape in tapes.items():  # the full double keeps no tape
                eager = [step.call.name for step in tape.steps if step.eager] if tape is not None else []
                breaks[bucket] = {"eager": len(eager), "all_to_all": sum("all_to_all" in name for name in eager)}
        params = SamplingParams(max_new_tokens=NEW_TOKENS)
        tokens = [out.output_token_ids for out in generate(engine, [list(p) for p in PROMPTS], params)]
        replays = engine.decode_cuda_graph_runner.metrics.replays_by_size if backend is not Backend.DISABLED else []
    finally:
        shutdown_tensor_parallel(group)
    if rank != 0:
        return None
    replayed = [size for size, count in enumerate(replays) if count]
    return {"tokens": tokens, "logits": logits, "breaks": breaks, "replayed": replayed}


HEAD_DECODE_BUCKETS = (1, 2, 4)


def shared_head_outputs(rank: int, world_size: int, init_method: str, payload: tuple[str, str]) -> dict[str, Any]:
    """Rank 0's greedy tokens of the sharded model with its decode steps replaying graphs (the CPU double of the
    ``decode`` backend, buckets ``HEAD_DECODE_BUCKETS``, captured by the model runner, which reserves the head's
    gather buffer first), dense logits per prompt, the decode sizes that replayed, the gather buffer's address and
    rows, and every gather the head made (rows, address, in a graph), per rank. Every rank runs the same greedy
    steps."""
    preset, decode = payload
    group = join(rank, world_size, init_method)
    try:
        recorder = GatherRecorder(group.choose_all_reduce("auto", torch.float32, 64 * 64).communicator)
        register_communicator(group.group_name, recorder)
        model = random_model(config_of(preset), seed=5, shard=group.shard_plan())
        backend = Backend(decode)
        graphs = CudaGraphConfig(
            decode=PhaseConfig(backend, HEAD_DECODE_BUCKETS, max(HEAD_DECODE_BUCKETS)),
            prefill=PhaseConfig(Backend.DISABLED, (), 0),
        )
        engine = ModelRunner(
            model, graphs, cache_config=cache_config(1), kernel_backend="torch", capture_barrier=group.capture_barrier
        )
        double = CpuReplayBackend(backend, options=CaptureOptions(barrier=group.capture_barrier))
        runner = engine.capture_cuda_graph_variant(Phase.DECODE, lora=False, backend=double)
        captured = len(recorder.gathers)
        params = SamplingParams(max_new_tokens=NEW_TOKENS)
        tokens = [out.output_token_ids for out in generate(engine, [list(p) for p in PROMPTS], params)]
        logits = [reference_logits(model, prompt) for prompt in PROMPTS]
        replays = runner.metrics.replays_by_size
        assert model.logits_gather is not None
        buffer = {"address": model.logits_gather.data_ptr(), "rows": model.logits_gather.rows}
        engine.shutdown()
        gathers = [(record.rows, record.address, record.in_graph) for record in recorder.gathers]
        mine = {"buffer": buffer, "gathers": gathers, "captured": captured}
        everyone: list[Any] = [None] * world_size
        dist.all_gather_object(everyone, mine, group=group.cpu_group)
    finally:
        shutdown_tensor_parallel(group)
    replayed = [size for size, count in enumerate(replays) if count]
    return {"tokens": tokens, "logits": logits, "replayed": replayed, "ranks": everyone}


STOPPED_WAIT_S = 180.0
"""The collective timeout of the workers whose waiting rank the launcher must stop: far above the time ranks take to
start on a loaded machine, so a test bounded well below it tells a stopped rank from one that waited it out."""


def raises_on_rank_1(rank: int, world_size: int, init_method: str, payload: Any) -> None:
    """Rank 1 fails after joining; rank 0 waits in a collective that rank 1 never enters."""
    group = join(rank, world_size, init_method, STOPPED_WAIT_S)
    if rank == 1:
        raise ValueError("rank 1 cannot load its shard")
    dist.all_reduce(torch.ones(4), group=group.group)


def killed_on_rank_1(rank: int, world_size: int, init_method: str, payload: Any) -> None:
    """Rank 1 is killed (SIGKILL, as the kernel's out-of-memory killer does) after joining: it reports nothing;
    rank 0 waits in a collective that rank 1 never enters."""
    group = join(rank, world_size, init_method, STOPPED_WAIT_S)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(4), group=group.group)


def hangs_on_rank_1(rank: int, world_size: int, init_method: str, timeout_s: float) -> None:
    """Rank 1 never enters the collective (alive but stuck); rank 0's wait must time out."""
    group = join(rank, world_size, init_method, timeout_s)
    if rank == 1:
        time.sleep(120)
    dist.all_reduce(torch.ones(4), group=group.group)


MiB = 2**20
SIMULATED_MEMORY = SimulatedDeviceMemory(
    total_bytes=1024 * MiB, activation_bytes_per_row=3 * MiB, graph_bytes=MiB, graph_bytes_per_row=64 * 1024
)
"""The simulated device of the budget tests: a forward takes 3 MiB a row, a graph 1 MiB and 64 KiB a row."""
BUDGET_BUCKETS = (1, 2, 4, 8, 12, 16)


def budget_config(budget_mib: int) -> CudaGraphConfig:
    """Decode ``full`` at ``BUDGET_BUCKETS`` within ``budget_mib`` MiB, prefill eager."""
    budget = MemoryBudget(bytes=budget_mib * MiB)
    decode = PhaseConfig(Backend.FULL, BUDGET_BUCKETS, max(BUDGET_BUCKETS), memory_budget=budget)
    return CudaGraphConfig(decode=decode, prefill=PhaseConfig(Backend.DISABLED, (), 0))


def capture_within_budget(budget_mib: int, barrier: Any = None) -> DecodeCudaGraphRunner:
    """A decode runner of the tiny model, captured on the CPU test double's simulated device within ``budget_mib``,
    meeting the other ranks at ``barrier`` (none: one rank)."""
    config = budget_config(budget_mib)
    model = random_model(model_config_from_preset("tiny-qwen3-random"), seed=0)
    engine = ModelRunner(model, config, cache_config=cache_config(1), capture_barrier=barrier)
    backend = CpuReplayBackend(Backend.FULL, options=CaptureOptions(barrier=barrier), memory=SIMULATED_MEMORY)
    runner = DecodeCudaGraphRunner(engine, config, backend=backend, show_progress=False, capture_barrier=barrier)
    runner.capture()
    return runner


def capture_under_own_budget(
    rank: int, world_size: int, init_method: str, payload: tuple[list[int], bool]
) -> list[dict[str, Any]] | None:
    """Each rank captures within its own budget (``budgets_mib[rank]``), through the group's capture barrier when
    ``agree`` (else its plain barrier, deciding alone); rank 0 returns every rank's captured buckets, skip reasons
    and the bucket each batch size routes to."""
    budgets_mib, agree = payload
    group = join(rank, world_size, init_method)
    try:
        barrier = group.capture_barrier if agree else group.barrier
        runner = capture_within_budget(budgets_mib[rank], barrier)
        mine = {
            "captured": list(runner.captured_buckets),
            "skipped": dict(runner.skipped_buckets),
            "routes": [route.bucket for route in runner.routes.by_size],
        }
        runner.shutdown()
        everyone: list[Any] = [None] * world_size
        dist.all_gather_object(everyone, mine, group=group.cpu_group)
    finally:
        shutdown_tensor_parallel(group)
    return everyone if rank == 0 else None
