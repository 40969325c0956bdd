"""tc_piecewise on a real GPU, through the engine: the forward compiled once, split at the attention op, every shape
replayed as a flat sequence of graph segments and attention calls; greedy tokens equal eager for batch sizes 1..16
with both compilers, no recompile across 20 replays of every bucket, at most two compilations over five batch sizes
(padded and exact buckets), a replay that launches exactly pieces + split calls and never enters dynamo or FX (even
after ``torch._dynamo.reset()``), and a recapture after ``shutdown()``. ``auto`` runs the engine's Triton kernel set
here: its operations traced as custom ops (``torch.ops.cudagraph_triton``), inductor (or the eager compiler) around
them, Triton attention the split.
Also full graphs with compiled small buckets (``--torch-compile-max-bs``): the inductor-compiled forward inside the
one graph for batch sizes up to 8, tokens equal eager. With ``--torch-compile-mode max-autotune-no-cudagraphs`` both
compiled backends autotune their matmuls and still give eager tokens on one compilation.

Random-weight float32 models keep greedy ties out of the comparison. Every engine is shut down even when a test
fails, so a failure never leaves a graph pool behind for the next test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

import pytest
import torch
import torch._dynamo
import torch._inductor.config
from torch._dynamo.utils import counters

from cudagraph.backend import (
    BaseCudaGraphBackend,
    BreakableCudaGraphBackend,
    FullCudaGraphBackend,
    TcPiecewiseCudaGraphBackend,
)
from cudagraph.config import Backend, CudaGraphConfig, Phase, PhaseConfig
from cudagraph.engine.batch import SamplingParams
from cudagraph.engine.generate import generate
from cudagraph.engine.model import model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.engine.testing import release_synthetic_batch, synthetic_decode_batch
from cudagraph.runner import DecodeCudaGraphRunner

DECODE_BUCKETS = (1, 2, 4, 8, 12, 16)
PRESETS = ("tiny-qwen3-random", "tiny-llama-random")
COMPILERS = ("eager", "inductor")
FIVE_BATCH_SIZES = (1, 2, 3, 7, 16)
"""Across the gemv tiles (1, 2 rows) and the cuBLAS steps above them, padded and exact buckets."""


PREFILL_BUCKETS = (16, 32, 64, 128)


def graphs(decode: Backend, compiler: str = "eager", prefill: Backend = Backend.DISABLED) -> CudaGraphConfig:
    return CudaGraphConfig(
        decode=PhaseConfig(decode, () if decode is Backend.DISABLED else DECODE_BUCKETS, 16),
        prefill=PhaseConfig(prefill, () if prefill is Backend.DISABLED else PREFILL_BUCKETS, 128),
        tc_piecewise_compiler=compiler,
    )


@contextlib.contextmanager
def engine(
    preset: str, config: CudaGraphConfig, dtype: str = "float32", kernel_backend: str = "auto"
) -> Iterator[ModelRunner]:
    """A CUDA engine with random weights and its decode graphs captured; shut down on exit, pass or fail. ``auto``
    kernels are Triton's, compiled forwards included (their operations are custom ops inductor compiles around);
    a test of what inductor makes of the layers' own ops asks for ``torch``."""
    torch._dynamo.reset()
    counters.clear()
    model = random_model(model_config_from_preset(preset), seed=3, dtype=dtype, device="cuda")
    runner = ModelRunner(
        model, config, cache_config=CacheConfig(max_num_reqs=24, max_context_len=96), kernel_backend=kernel_backend
    )
    try:
        runner.init_cuda_graphs()
        yield runner
    finally:
        runner.shutdown()
        torch._dynamo.reset()


def shrinking_workload(count: int = 17, seed: int = 0) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompt ``i`` wants ``i + 1`` tokens, so the decode batch walks down through every size from 16 to 1."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 24, (count,), generator=generator).tolist()
    prompts = [torch.randint(0, 512, (n,), generator=generator).tolist() for n in lengths]
    return prompts, [SamplingParams(max_new_tokens=i + 1) for i in range(count)]


def tokens(model_runner: ModelRunner, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    return [output.output_token_ids for output in generate(model_runner, prompts, params)]


BackendT = TypeVar("BackendT", bound=BaseCudaGraphBackend)


def decode_graphs(model_runner: ModelRunner, kind: type[BackendT]) -> tuple[DecodeCudaGraphRunner, BackendT]:
    """The decode runner and the backend its graphs were captured with, checked to be a ``kind``."""
    runner = model_runner.decode_cuda_graph_runner
    assert runner is not None, "decode graphs were not captured"
    assert isinstance(runner.backend, kind)
    return runner, runner.backend


TcPiecewiseDecode = tuple[ModelRunner, DecodeCudaGraphRunner, TcPiecewiseCudaGraphBackend]


@pytest.fixture(params=COMPILERS)
def tc_piecewise_decode(request: pytest.FixtureRequest) -> Iterator[TcPiecewiseDecode]:
    """The tiny Qwen3 engine with tc_piecewise decode graphs (each compiler in turn), its decode runner and backend."""
    with engine("tiny-qwen3-random", graphs(Backend.TC_PIECEWISE, request.param)) as graphed:
        runner, backend = decode_graphs(graphed, TcPiecewiseCudaGraphBackend)
        yield graphed, runner, backend


def assert_replays_match_eager(
    model_runner: ModelRunner, runner: DecodeCudaGraphRunner, batch_sizes: Iterable[int], replays: int
) -> None:
    """Every batch size runs on the graphs and its last of ``replays`` replays gives the eager forward's logits."""
    for batch_size in batch_sizes:
        batch = synthetic_decode_batch(model_runner, batch_size, context_len=40, seed=batch_size)
        try:
            assert runner.can_run(batch)
            expected = model_runner.forward(batch).clone()
            for _ in range(replays):
                got = runner.replay(batch)
            torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        finally:
            release_synthetic_batch(model_runner, batch, context_len=40)


@pytest.mark.gpu
@pytest.mark.parametrize("compiler", COMPILERS)
@pytest.mark.parametrize("preset", PRESETS)
def test_tc_piecewise_decode_gives_eager_tokens_at_every_batch_size(preset: str, compiler: str) -> None:
    prompts, params = shrinking_workload()
    with engine(preset, graphs(Backend.DISABLED)) as eager:
        expected = tokens(eager, prompts, params)
    with engine(preset, graphs(Backend.TC_PIECEWISE, compiler)) as graphed:
        assert graphed.kernels.name == "triton" and graphed.model.kernels is graphed.kernels  # auto's pick
        _, backend = decode_graphs(graphed, TcPiecewiseCudaGraphBackend)
        num_layers = graphed.model.config.num_layers
        assert backend.compile_stats.pieces == backend.compile_stats.split_ops + 1 == num_layers + 1
        assert backend.shapes == DECODE_BUCKETS
        # Every attention call of every shape replays its bound kernel calls (no dispatcher, no per-call views).
        assert [backend.bound_split_calls(bucket) for bucket in DECODE_BUCKETS] == [num_layers] * len(DECODE_BUCKETS)
        got = tokens(graphed, prompts, params)
        replays = graphed.cuda_graph_metrics[Phase.DECODE].replays_by_size
        assert all(replays[size] > 0 for size in range(1, 17)), f"a batch size ran eagerly: {replays}"
        assert backend.compile_stats.compilations == 1, "the forward recompiled while decoding"
        assert dict(counters["graph_break"]) == {}
    for index, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert have == want, f"prompt {index} diverged ({compiler})"


@pytest.mark.gpu
def test_five_batch_sizes_replay_on_at_most_two_compilations_and_match_eager(
    tc_piecewise_decode: TcPiecewiseDecode,
) -> None:
    graphed, runner, backend = tc_piecewise_decode
    assert_replays_match_eager(graphed, runner, FIVE_BATCH_SIZES, replays=5)
    assert backend.compile_stats.compilations <= 2
    assert backend.compile_stats.recompiles_at_replay == 0
    assert dict(counters["graph_break"]) == {}


@pytest.mark.gpu
def test_twenty_replays_of_every_bucket_never_recompile_and_match_eager(tc_piecewise_decode: TcPiecewiseDecode) -> None:
    graphed, runner, backend = tc_piecewise_decode
    unique_graphs = counters["stats"]["unique_graphs"]
    assert_replays_match_eager(graphed, runner, range(1, 17), replays=20)
    assert backend.compile_stats.compilations == 1
    assert backend.compile_stats.recompiles == 0
    assert counters["stats"]["unique_graphs"] == unique_graphs
    assert dict(counters["graph_break"]) == {}


@pytest.mark.gpu
def test_a_replay_launches_pieces_plus_split_calls_and_never_enters_dynamo(
    tc_piecewise_decode: TcPiecewiseDecode,
) -> None:
    graphed, runner, backend = tc_piecewise_decode
    stats = backend.compile_stats
    for bucket in DECODE_BUCKETS:
        sequence = backend.sequence(bucket)
        assert (sequence.segments, len(sequence.split_calls)) == (stats.pieces, stats.split_ops)
        assert sequence.launches == stats.pieces + stats.split_ops
        # Each attention split's rotary and KV store (one Triton launch) are in the graph segment before it; the
        # split call only attends.
        assert sequence.prefixes == stats.split_ops
        assert all(call.kwargs.get("rotated") is True for call in sequence.split_calls)
    batch = synthetic_decode_batch(graphed, 7, context_len=40, seed=7)
    try:
        expected = graphed.forward(batch).clone()  # eager: no compiled forward outside a capture
        torch._dynamo.reset()  # compiled code and guards gone: a replay must not need them
        entered: list[str] = []

        def watch(frame: object, event: str, arg: object) -> None:
            filename = frame.f_code.co_filename  # type: ignore[attr-defined]
            if event == "call" and ("/torch/_dynamo/" in filename or "/torch/fx/" in filename):
                entered.append(f"{filename}:{frame.f_code.co_name}")  # type: ignore[attr-defined]

        sys.setprofile(watch)
        try:
            for _ in range(5):
                got = runner.replay(batch)
        finally:
            sys.setprofile(None)
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        assert entered == [], f"a replay ran dynamo or FX code: {entered[:5]}"
        assert stats.compilations == 1
    finally:
        release_synthetic_batch(graphed, batch, context_len=40)


def replay_kernels(model_runner: ModelRunner, kind: type[BaseCudaGraphBackend], batch_size: int) -> list[str]:
    """The CUDA kernels one decode replay of ``batch_size`` launches (after a warm replay), by name; the replay's
    output is checked against eager's."""
    runner, _ = decode_graphs(model_runner, kind)
    batch = synthetic_decode_batch(model_runner, batch_size, context_len=40, seed=batch_size)
    try:
        expected = model_runner.forward(batch).clone()
        runner.replay(batch)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            got = runner.replay(batch).clone()
            torch.cuda.synchronize()
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    finally:
        release_synthetic_batch(model_runner, batch, context_len=40)
    return [
        event.name
        for event in profile.events()
        if event.device_type == torch.autograd.DeviceType.CUDA and not event.name.startswith(("Memcpy", "Memset"))
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("compiler", COMPILERS)
def test_a_tc_piecewise_replay_launches_no_more_kernels_than_a_breakable_one(compiler: str) -> None:
    """Over the Triton set the compiled forward rotates and stores each layer's keys and values in one launch, as
    the eager forward a breakable graph captures does: a batch-1 decode replay launches no more kernels than a
    breakable replay of the same bucket."""
    with engine("tiny-qwen3-random", graphs(Backend.BREAKABLE)) as breakable:
        assert breakable.kernels.name == "triton"
        baseline = replay_kernels(breakable, BreakableCudaGraphBackend, 1)
    with engine("tiny-qwen3-random", graphs(Backend.TC_PIECEWISE, compiler)) as graphed:
        assert graphed.kernels.name == "triton"
        got = replay_kernels(graphed, TcPiecewiseCudaGraphBackend, 1)
    assert baseline, "the profiler saw no kernel of the breakable replay"
    assert len(got) <= len(baseline), (len(got), len(baseline), sorted(set(got) - set(baseline))[:20])


@pytest.mark.gpu
def test_recapture_after_shutdown_reuses_the_compilation_and_gives_eager_tokens() -> None:
    prompts, params = shrinking_workload(count=9, seed=2)
    with engine("tiny-llama-random", graphs(Backend.DISABLED)) as eager:
        expected = tokens(eager, prompts, params)
    with engine("tiny-llama-random", graphs(Backend.TC_PIECEWISE, "inductor")) as graphed:
        runner, backend = decode_graphs(graphed, TcPiecewiseCudaGraphBackend)
        runner.shutdown()
        assert not runner.captured and backend.shapes == ()
        runner.capture()
        assert runner.captured and backend.shapes == DECODE_BUCKETS
        assert backend.compile_stats.compilations == 1  # the compiled forward survives shutdown
        got = tokens(graphed, prompts, params)
    assert got == expected


@pytest.mark.gpu
@pytest.mark.parametrize("compiler", COMPILERS)
def test_tc_piecewise_prefill_and_decode_give_eager_tokens(compiler: str) -> None:
    """Prefill by token buckets (padding exercised: prompts of 2..23 tokens, several per step) and decode, both
    tc_piecewise, each phase with its own compilation and graphs in the one pool."""
    prompts, params = shrinking_workload(count=9, seed=1)
    with engine("tiny-llama-random", graphs(Backend.DISABLED)) as eager:
        expected = [o.output_token_ids for o in generate(eager, prompts, params, max_prefill_tokens=100)]
    config = graphs(Backend.TC_PIECEWISE, compiler, prefill=Backend.TC_PIECEWISE)
    with engine("tiny-llama-random", config) as graphed:
        prefill_runner = graphed.prefill_cuda_graph_runner
        assert prefill_runner is not None and isinstance(prefill_runner.backend, TcPiecewiseCudaGraphBackend)
        got = [o.output_token_ids for o in generate(graphed, prompts, params, max_prefill_tokens=100)]
        assert prefill_runner.backend.compile_stats.compilations == 1  # prefill buckets are all >= 16 tokens
    assert got == expected


# -- full graphs with compiled small buckets (--torch-compile-max-bs) ------------------------------------------------

COMPILE_MAX_BS = 8


def compiled_full(max_bs: int = COMPILE_MAX_BS) -> CudaGraphConfig:
    return CudaGraphConfig(
        decode=PhaseConfig(Backend.FULL, DECODE_BUCKETS, 16),
        prefill=PhaseConfig(Backend.DISABLED, (), 0),
        torch_compile_max_bs=max_bs,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("preset", PRESETS)
def test_full_with_compiled_small_buckets_gives_eager_tokens_at_every_batch_size(preset: str) -> None:
    """Batch sizes 1..8 replay graphs of the inductor-compiled forward, 12 and 16 graphs of the eager one."""
    prompts, params = shrinking_workload()
    with engine(preset, graphs(Backend.DISABLED)) as eager:
        expected = tokens(eager, prompts, params)
    with engine(preset, compiled_full()) as graphed:
        _, backend = decode_graphs(graphed, FullCudaGraphBackend)
        assert backend.compiled_forward is not None and backend.compile_stats is not None
        assert backend.shapes == DECODE_BUCKETS
        got = tokens(graphed, prompts, params)
        runner = graphed.decode_cuda_graph_runner
        assert runner is not None and runner.recompiles_at_replay == 0
        assert runner.stats.compilations >= 1 and runner.stats.compile_seconds > 0
    for index, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert have == want, f"prompt {index} diverged"


@pytest.mark.gpu
def test_compiled_small_buckets_compile_once_and_the_graph_runs_inductor_kernels() -> None:
    with engine("tiny-qwen3-random", compiled_full(), kernel_backend="torch") as graphed:
        _, backend = decode_graphs(graphed, FullCudaGraphBackend)
        assert backend.compile_stats is not None and backend.compile_stats.compilations == 1
        kernels = replay_kernels(graphed, FullCudaGraphBackend, 4)  # the replay checked against eager's output
    assert any(name.startswith("triton_") for name in kernels), sorted(set(kernels))[:20]


BF16_TOLERANCE = {"compiled_full": 5e-2, "tc_piecewise_eager": 2e-2, "tc_piecewise_inductor": 2e-2}
"""Absolute and relative tolerance on bf16 logits by mode: a compiled full forward's glue rounds where eager's does
not; tc_piecewise calls the Triton set's kernels themselves, so only the glue between them may differ."""


@pytest.mark.gpu
@pytest.mark.parametrize("mode", sorted(BF16_TOLERANCE))
def test_compiled_rounding_in_bf16_stays_within_tolerance_and_keeps_greedy_tokens(mode: str) -> None:
    """Logits of a random bf16 Qwen3 at batch 1 and 4 within the mode's tolerance of eager's, and greedy tokens equal
    over 16 steps for 4 prompts."""
    compiler = mode.rpartition("_")[2]
    config = compiled_full() if mode == "compiled_full" else graphs(Backend.TC_PIECEWISE, compiler)
    prompts, _ = shrinking_workload(count=4, seed=7)
    params = [SamplingParams(max_new_tokens=16) for _ in prompts]

    def bf16_engine(graph_config: CudaGraphConfig) -> contextlib.AbstractContextManager[ModelRunner]:
        return engine("tiny-qwen3-random", graph_config, dtype="bfloat16")

    with bf16_engine(graphs(Backend.DISABLED)) as eager:
        expected_tokens = tokens(eager, prompts, params)
    with bf16_engine(config) as graphed:
        runner = graphed.decode_cuda_graph_runner
        assert runner is not None
        tolerance = BF16_TOLERANCE[mode]
        for batch_size in (1, 4):
            batch = synthetic_decode_batch(graphed, batch_size, context_len=40, seed=batch_size)
            try:
                expected = graphed.forward(batch).clone()
                got = runner.replay(batch).clone()
            finally:
                release_synthetic_batch(graphed, batch, context_len=40)
            torch.testing.assert_close(got, expected, atol=tolerance, rtol=tolerance)
        got_tokens = tokens(graphed, prompts, params)
    assert got_tokens == expected_tokens


# -- --torch-compile-mode max-autotune-no-cudagraphs ------------------------------------------------------------------

AUTOTUNE_MODE = "max-autotune-no-cudagraphs"


@pytest.mark.gpu
@pytest.mark.parametrize("backend_kind", ["compiled_full", "tc_piecewise_inductor"])
def test_compile_mode_max_autotune_autotunes_and_gives_eager_tokens(backend_kind: str) -> None:
    """The mode reaches inductor (matmuls autotuned: inductor's own counter, with its caches off so that a warm
    machine cannot skip the tuning), the forward compiles once, and greedy tokens equal eager at every batch size."""
    base = compiled_full() if backend_kind == "compiled_full" else graphs(Backend.TC_PIECEWISE, "inductor")
    config = dataclasses.replace(base, torch_compile_mode=AUTOTUNE_MODE)
    prompts, params = shrinking_workload(count=9, seed=2)
    # The torch kernel set: its projections are matmuls inductor sees (the triton set's are inside its custom ops).
    with engine("tiny-qwen3-random", graphs(Backend.DISABLED), kernel_backend="torch") as eager:
        expected = tokens(eager, prompts, params)
    with (
        torch._inductor.config.patch(fx_graph_cache=False, autotune_local_cache=False),
        engine("tiny-qwen3-random", config, kernel_backend="torch") as graphed,
    ):
        runner = graphed.decode_cuda_graph_runner
        assert runner is not None
        backend = runner.backend
        if isinstance(backend, FullCudaGraphBackend):
            assert backend.compile_mode == AUTOTUNE_MODE
        else:
            assert isinstance(backend, TcPiecewiseCudaGraphBackend) and backend.compiler.mode == AUTOTUNE_MODE
        assert counters["inductor"]["select_algorithm_autotune"] > 0, dict(counters["inductor"])
        got = tokens(graphed, prompts, params)
        assert backend.compile_stats is not None and backend.compile_stats.compilations == 1
        assert runner.recompiles_at_replay == 0
    for index, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert have == want, f"prompt {index} diverged ({backend_kind}, {AUTOTUNE_MODE})"
