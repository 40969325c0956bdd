"""Rank functions for the tensor-parallel GPU tests (a module of their own so ``spawn`` can import them by name)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from cudagraph.config import Backend, CapturePolicy, CudaGraphConfig, MemoryBudget, Phase, PhaseConfig
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

DECODE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64)
LOGIT_PROMPTS = ([1, 2, 3], [7, 300, 11, 45, 2, 9], [64, 65, 66, 67, 68, 69, 70, 71])


@dataclass(frozen=True)
class EngineOptions:
    """How the engine of a run is built beyond the preset, dtype and decode backend: the kernel set, the attention
    backend, the KV page size, heads other than the preset's, and a head size other than the preset's (FlashInfer's
    fused kernels need 64 or more; the tiny presets have 32 and 16)."""

    kernel_backend: str = "auto"
    attention_backend: str = "torch"
    page_size: int = 1
    head_dim: int | None = None
    smaller_budget_rank: int | None = None
    """A rank whose decode graphs get a memory budget that holds some buckets but not all (the others get none):
    the ranks must still capture the same buckets."""
    moe_a2a_backend: str = "none"
    """How a MoE model's sparse blocks reach the experts split over the ranks (``ShardPlan.moe_a2a_backend``)."""

    heads: tuple[int, int] | None = None
    """Query and KV heads other than the preset's (eight ranks need eight of each; the tiny presets have 4 and 2)."""

    def model_config(self, preset: str) -> ModelConfig:
        """The preset's config with this head size and these heads."""
        changes: dict[str, int] = {} if self.head_dim is None else {"head_dim": self.head_dim}
        if self.heads is not None:
            changes.update(num_heads=self.heads[0], num_kv_heads=self.heads[1])
        return model_config_from_preset(preset).with_overrides(**changes)


DEFAULT_OPTIONS = EngineOptions()
FUSED_PAGED = EngineOptions(kernel_backend="flashinfer", attention_backend="flashinfer", page_size=16, head_dim=64)
"""FlashInfer's fused kernel set and paged attention over 16-token pages."""


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


def run_engine(
    model: Any,
    decode: Backend,
    barrier: Any = None,
    broadcaster: Any = None,
    rank: int = 0,
    options: EngineOptions = DEFAULT_OPTIONS,
) -> Any:
    """Greedy tokens of the shrinking workload and the decode batch sizes that replayed a graph (rank 0), or
    ``None`` after following rank 0 (other ranks)."""
    cache = CacheConfig(max_num_reqs=80, max_context_len=160, page_size=options.page_size)
    config = graphs(decode)
    built = {
        "cache_config": cache,
        "kernel_backend": options.kernel_backend,
        "attention_backend": options.attention_backend,
    }
    if rank != 0:
        follower = ModelRunner(model, config, capture_barrier=barrier, **built)
        try:
            captured = capture_graphs(follower, rank, options)
            follow(follower, broadcaster)
        finally:
            follower.shutdown()
        return None
    if broadcaster is None:
        runner = ModelRunner(model, config, **built)
    else:
        runner = DrivingModelRunner(model, config, capture_barrier=barrier, broadcaster=broadcaster, **built)
    if options.kernel_backend != "auto":
        assert runner.kernels.name == options.kernel_backend
    try:
        captured = capture_graphs(runner, rank, options)
        exchange_breaks = all_to_all_breaks(runner)
        prompts, params = shrinking_workload()
        tokens = [out.output_token_ids for out in generate(runner, prompts, params)]
    finally:
        if broadcaster is not None:
            broadcaster.stop()
        runner.shutdown()
    # The engine's decode metrics outlive its runners: the batch sizes that replayed a graph.
    replays_by_size = runner.cuda_graph_metrics[Phase.DECODE].replays_by_size
    replayed = [size for size, count in enumerate(replays_by_size) if count]
    return {"tokens": tokens, "replayed": replayed, "captured": captured, "all_to_all_breaks": exchange_breaks}


def all_to_all_breaks(engine: ModelRunner) -> dict[int, int]:
    """Each captured decode bucket's eager breaks at the ``all_to_all`` op (graphs that keep no eager calls, full
    and tc_piecewise ones, are left out)."""
    decode = engine.decode_cuda_graph_runner
    if decode is None:
        return {}
    counts = {}
    for bucket in decode.captured_buckets:
        eager_calls = getattr(decode.backend.entry(bucket).graph, "eager_calls", None)
        if eager_calls is not None:
            counts[bucket] = sum("all_to_all" in call.name for call in eager_calls)
    return counts


def capture_graphs(engine: ModelRunner, rank: int, options: EngineOptions) -> list[list[int]]:
    """Capture the engine's graphs (with ``options.smaller_budget_rank``'s budget on that rank); every rank's
    captured decode buckets (this rank's alone without a group)."""
    if options.smaller_budget_rank is None:
        engine.init_cuda_graphs()
    else:
        runner = DecodeCudaGraphRunner(
            engine,
            engine.cuda_graph_config,
            show_progress=False,
            capture_barrier=engine.capture_barrier,
            metrics=engine.cuda_graph_metrics[Phase.DECODE],
        )
        estimate = runner.estimate_capture_memory()
        if rank == options.smaller_budget_rank:
            # Halfway between the estimate of the smaller half of the buckets and that of all of them: room for some
            # buckets, not for all (the tiny model's graphs are near the 2 MiB a device reading resolves).
            half = runner.buckets[: len(runner.buckets) // 2]
            between = (estimate.total_bytes_for(half) + estimate.total_bytes_for(runner.buckets)) // 2
            runner.memory_budget = MemoryBudget(bytes=between)
        runner.capture()
        engine.decode_cuda_graph_runner = runner
    decode = engine.decode_cuda_graph_runner
    mine = list(decode.captured_buckets) if decode is not None else []
    group = getattr(engine.capture_barrier, "group", None)
    if group is None:
        return [mine]
    everyone: list[list[int]] = [[] for _ in range(group.world_size)]
    dist.all_gather_object(everyone, mine, group=group.cpu_group)
    return everyone


def single_gpu(preset: str, dtype: str, decode: Backend, options: EngineOptions = DEFAULT_OPTIONS) -> dict[str, Any]:
    """The same workload and logits at TP=1 on ``cuda:0`` (in the test process)."""
    model = random_model(options.model_config(preset), seed=3, dtype=dtype, device="cuda:0")
    result = run_engine(model, decode, options=options)
    result["logits"] = [reference_logits(model, prompt).cpu() for prompt in LOGIT_PROMPTS]
    return result


def tensor_parallel(
    rank: int,
    world_size: int,
    init_method: str,
    payload: tuple[str, str, str, str] | tuple[str, str, str, str, EngineOptions],
) -> Any:
    """One rank: the sharded model runs the workload with ``decode`` graphs (built as the optional fifth item,
    ``EngineOptions``, says); rank 0 returns tokens, replayed sizes, dense logits and the all-reduce choice."""
    preset, dtype, decode, all_reduce = payload[:4]
    options = payload[4] if len(payload) == 5 else DEFAULT_OPTIONS
    device = torch.device("cuda", rank)
    group = init_tensor_parallel(GroupOptions(rank, world_size, device, init_method, timeout_s=120.0))
    try:
        config = options.model_config(preset)
        shard = group.shard_plan(options.moe_a2a_backend)
        model = random_model(config, seed=3, dtype=dtype, device=device, shard=shard)
        choice = group.choose_all_reduce(all_reduce, model.dtype, 64 * config.hidden_size)
        result = run_engine(model, Backend(decode), group.capture_barrier, StepBroadcaster(group), rank, options)
        # After the engine: through the kernel set it chose for the model, as single_gpu's logits are.
        logits = [reference_logits(model, prompt).cpu() for prompt in LOGIT_PROMPTS]
    finally:
        shutdown_tensor_parallel(group)
    if rank != 0:
        return None
    return {**result, "logits": logits, "all_reduce": choice.kind, "reason": choice.reason}


def shared_head_gathers(rank: int, world_size: int, init_method: str, preset: str) -> Any:
    """One rank: the sharded float32 model runs the shrinking workload with decode ``full`` graphs, every all-gather
    of its head recorded (``GatherRecorder``); rank 0 returns the tokens, the replayed sizes and, per rank, the head's
    gather buffer (rows, address) and the gathers captured into graphs (rows, address)."""
    device = torch.device("cuda", rank)
    group = init_tensor_parallel(GroupOptions(rank, world_size, device, init_method, timeout_s=120.0))
    try:
        config = model_config_from_preset(preset)
        model = random_model(config, seed=3, dtype="float32", device=device, shard=group.shard_plan())
        choice = group.choose_all_reduce("auto", model.dtype, 64 * config.hidden_size)
        recorder = GatherRecorder(choice.communicator)
        register_communicator(group.group_name, recorder)
        result = run_engine(model, Backend.FULL, group.capture_barrier, StepBroadcaster(group), rank)
        assert model.logits_gather is not None
        mine = {
            "rows": model.logits_gather.rows,
            "address": model.logits_gather.data_ptr(),
            "captured": [(record.rows, record.address) for record in recorder.gathers if record.in_graph],
        }
        everyone: list[Any] = [None] * world_size
        dist.all_gather_object(everyone, mine, group=group.cpu_group)
    finally:
        shutdown_tensor_parallel(group)
    return {**result, "ranks": everyone} if rank == 0 else None


def eager_and_graphed(
    rank: int, world_size: int, init_method: str, payload: tuple[str, str, tuple[str, ...], EngineOptions]
) -> Any:
    """One rank: the sharded model, built once (a large shape takes a while to fill), runs the shrinking workload
    eagerly and then under each decode backend of ``payload``; rank 0 returns each run's result keyed by backend
    (``"disabled"`` for the eager run)."""
    preset, dtype, backends, options = payload
    device = torch.device("cuda", rank)
    group = init_tensor_parallel(GroupOptions(rank, world_size, device, init_method, timeout_s=300.0))
    runs: dict[str, Any] = {}
    try:
        config = options.model_config(preset)
        model = random_model(
            config, seed=3, dtype=dtype, device=device, shard=group.shard_plan(options.moe_a2a_backend)
        )
        group.choose_all_reduce("auto", model.dtype, 64 * config.hidden_size)
        for decode in (Backend.DISABLED.value, *backends):
            runs[decode] = run_engine(
                model, Backend(decode), group.capture_barrier, StepBroadcaster(group), rank, options
            )
            torch.cuda.empty_cache()
    finally:
        shutdown_tensor_parallel(group)
    return runs if rank == 0 else None


def assert_graphs_give_eager_tokens(runs: dict[str, Any], backends: tuple[str, ...]) -> None:
    """``eager_and_graphed``'s runs: every backend replayed each decode batch size 1..64 and gave the eager run's
    greedy tokens for every prompt."""
    eager = runs[Backend.DISABLED.value]
    for backend in backends:
        graphed = runs[backend]
        assert graphed["replayed"] == list(range(1, 65)), f"{backend}: every decode batch size should have replayed"
        for index, (want, have) in enumerate(zip(eager["tokens"], graphed["tokens"], strict=True)):
            assert have == want, f"{backend}, prompt {index} diverged"


LIFE_BUCKETS = (1, 2, 4, 8, 16)


def _life_tokens(engine: ModelRunner, seed: int) -> list[list[int]]:
    """Greedy tokens of twelve prompts wanting 1..12 tokens (decode walks through batch sizes 12..1)."""
    prompts, params = shrinking_workload(count=12, seed=seed)
    return [out.output_token_ids for out in generate(engine, prompts, params)]


def lazy_life_on_rank(rank: int, world_size: int, init_method: str, payload: tuple[str, str]) -> Any:
    """One rank of a TP group living a life under the lazy policy with ``decode`` graphs: generate, sleep, wake,
    generate. Every rank runs the same steps in lock step (an eager engine of the same shard beside the graphed
    one); rank 0 returns every rank's captured buckets after each generation, lazy capture counts, bytes sleep gave
    back, and whether each generation equalled the eager engine's tokens."""
    preset, decode = payload
    device = torch.device("cuda", rank)
    group = init_tensor_parallel(GroupOptions(rank, world_size, device, init_method, timeout_s=120.0))
    cache = CacheConfig(max_num_reqs=24, max_context_len=64, num_kv_slots=262144)
    lazy = CudaGraphConfig(
        decode=PhaseConfig(Backend(decode), LIFE_BUCKETS, 16, capture_policy=CapturePolicy.LAZY),
        prefill=PhaseConfig(Backend.DISABLED, (), 0),
    )
    eager_config = CudaGraphConfig(
        decode=PhaseConfig(Backend.DISABLED, (), 0), prefill=PhaseConfig(Backend.DISABLED, (), 0)
    )
    try:
        config = model_config_from_preset(preset)
        model = random_model(config, seed=3, dtype="float32", device=device, shard=group.shard_plan())
        group.choose_all_reduce("auto", model.dtype, 16 * config.hidden_size)
        eager = ModelRunner(model, eager_config, cache_config=cache)
        graphed = ModelRunner(model, lazy, cache_config=cache, capture_barrier=group.capture_barrier)
        try:
            runner = graphed.init_decode_cuda_graph()
            assert runner is not None
            started_with = list(runner.captured_buckets)
            first_equal = _life_tokens(graphed, 1) == _life_tokens(eager, 1)
            after_first = list(runner.captured_buckets)
            levels = graphed.sleep()
            asleep_with = list(runner.captured_buckets)
            graphed.wake()
            replays = runner.metrics.replays
            second_equal = _life_tokens(graphed, 2) == _life_tokens(eager, 2)
            mine = {
                "started_with": started_with,
                "after_first": after_first,
                "asleep_with": asleep_with,
                "after_wake": list(runner.captured_buckets),
                "equal": [first_equal, second_equal],
                "replayed_after_wake": runner.metrics.replays - replays,
                "lazy_captures": runner.metrics.lazy_captures,
                "freed_by_sleep": levels.freed_by_sleep,
                "state": runner.state.name,
            }
        finally:
            graphed.shutdown()
            eager.shutdown()
        everyone: list[Any] = [None] * world_size
        dist.all_gather_object(everyone, mine, group=group.cpu_group)
    finally:
        shutdown_tensor_parallel(group)
    return everyone if rank == 0 else None
