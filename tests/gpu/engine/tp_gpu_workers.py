"""Rank functions for the tensor-parallel GPU tests (a module of their own so ``spawn`` can import them by name)."""

from __future__ import annotations

from typing import Any

import torch

from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
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
from cudagraph.engine.model import model_config_from_preset, random_model, reference_logits
from cudagraph.engine.model_runner import CacheConfig, ModelRunner

DECODE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64)
LOGIT_PROMPTS = ([1, 2, 3], [7, 300, 11, 45, 2, 9], [64, 65, 66, 67, 68, 69, 70, 71])


def graphs(decode: Backend) -> CudaGraphConfig:
    """``decode`` graphs at every decode bucket up to 64, prefill eager."""
    buckets = () if decode is Backend.DISABLED else DECODE_BUCKETS
    return CudaGraphConfig(decode=PhaseConfig(decode, buckets, 64), prefill=PhaseConfig(Backend.DISABLED, (), 0))


def shrinking_workload(count: int = 65, seed: int = 0) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompt ``i`` wants ``i + 1`` tokens: decode batches walk down through every size from 64 to 1."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 24, (count,), generator=generator).tolist()
    prompts = [torch.randint(0, 512, (n,), generator=generator).tolist() for n in lengths]
    return prompts, [SamplingParams(max_new_tokens=i + 1) for i in range(count)]


def run_engine(model: Any, decode: Backend, barrier: Any = None, broadcaster: Any = None, rank: int = 0) -> Any:
    """Greedy tokens of the shrinking workload and the decode batch sizes that replayed a graph (rank 0), or
    ``None`` after following rank 0 (other ranks)."""
    cache = CacheConfig(max_num_reqs=80, max_context_len=160)
    config = graphs(decode)
    if rank != 0:
        follower = ModelRunner(model, config, cache_config=cache, capture_barrier=barrier)
        try:
            follower.init_cuda_graphs()
            follow(follower, broadcaster)
        finally:
            follower.shutdown()
        return None
    if broadcaster is None:
        runner = ModelRunner(model, config, cache_config=cache)
    else:
        runner = DrivingModelRunner(model, config, cache_config=cache, capture_barrier=barrier, broadcaster=broadcaster)
    replayed: list[int] = []
    try:
        runner.init_cuda_graphs()
        decode_runner = runner.decode_cuda_graph_runner
        if decode_runner is not None:
            replay = decode_runner.replay

            def counting(batch: Any) -> Any:
                if decode_runner.can_run(batch):
                    replayed.append(batch.batch_size)
                return replay(batch)

            decode_runner.replay = counting  # type: ignore[method-assign]
        prompts, params = shrinking_workload()
        tokens = [out.output_token_ids for out in generate(runner, prompts, params)]
    finally:
        if broadcaster is not None:
            broadcaster.stop()
        runner.shutdown()
    return {"tokens": tokens, "replayed": sorted(set(replayed))}


def single_gpu(preset: str, dtype: str, decode: Backend) -> dict[str, Any]:
    """The same workload and logits at TP=1 on ``cuda:0`` (in the test process)."""
    model = random_model(model_config_from_preset(preset), seed=3, dtype=dtype, device="cuda:0")
    result = run_engine(model, decode)
    result["logits"] = [reference_logits(model, prompt).cpu() for prompt in LOGIT_PROMPTS]
    return result


def tensor_parallel(rank: int, world_size: int, init_method: str, payload: tuple[str, str, str, str]) -> Any:
    """One rank: the sharded model runs the workload with ``decode`` graphs; rank 0 returns tokens, replayed
    sizes, dense logits and the all-reduce choice."""
    preset, dtype, decode, all_reduce = payload
    device = torch.device("cuda", rank)
    group = init_tensor_parallel(GroupOptions(rank, world_size, device, init_method, timeout_s=120.0))
    try:
        config = model_config_from_preset(preset)
        model = random_model(config, seed=3, dtype=dtype, device=device, shard=group.shard_plan())
        choice = group.choose_all_reduce(all_reduce, model.dtype, 64 * config.hidden_size)
        logits = [reference_logits(model, prompt).cpu() for prompt in LOGIT_PROMPTS]
        result = run_engine(model, Backend(decode), group.barrier, StepBroadcaster(group), rank)
    finally:
        shutdown_tensor_parallel(group)
    if rank != 0:
        return None
    return {**result, "logits": logits, "all_reduce": choice.kind, "reason": choice.reason}
