"""tc_piecewise over the engine's Triton kernel set on a real GPU: the set's operations traced as custom ops
(``torch.ops.cudagraph_triton``), inductor (or the eager compiler) around them, attention the split as before.
Greedy tokens equal eager's (the same kernels, launched eagerly) at every decode bucket and through prefill buckets,
with both compilers; one compilation (at most two) over five batch sizes; a replay never enters dynamo, FX or a
guard; bf16 logits within bf16 rounding of eager's; and ``auto`` picks the Triton set for tc_piecewise.

Triton attention (its decode and extend kernels), random-weight float32 models but in the bf16 test: greedy ties
stay out of the comparison. Every engine is shut down even when a test fails.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from cudagraph.backend import TcPiecewiseCudaGraphBackend
from cudagraph.config import Backend, CudaGraphConfig, Phase, PhaseConfig
from cudagraph.engine.batch import SamplingParams
from cudagraph.engine.generate import generate
from cudagraph.engine.model import model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.engine.testing import release_synthetic_batch, synthetic_decode_batch

pytestmark = pytest.mark.gpu

DECODE_BUCKETS = (1, 2, 4, 8, 12, 16)
PREFILL_BUCKETS = (16, 32, 64, 128)
PRESETS = ("tiny-qwen3-random", "tiny-llama-random")
COMPILERS = ("eager", "inductor")
FIVE_BATCH_SIZES = (1, 2, 3, 7, 16)
"""Across the gemv tiles (1, 2 rows) and the cuBLAS steps above them, padded and exact buckets."""


def graphs(decode: Backend, compiler: str = "eager", prefill: Backend = Backend.DISABLED) -> CudaGraphConfig:
    return CudaGraphConfig(
        decode=PhaseConfig(decode, () if decode is Backend.DISABLED else DECODE_BUCKETS, 16),
        prefill=PhaseConfig(prefill, () if prefill is Backend.DISABLED else PREFILL_BUCKETS, 128),
        tc_piecewise_compiler=compiler,
    )


@contextlib.contextmanager
def engine(
    preset: str, config: CudaGraphConfig, kernel_backend: str = "triton", dtype: str = "float32"
) -> Iterator[ModelRunner]:
    """A CUDA engine on the Triton kernels and Triton attention, its graphs captured; shut down on exit."""
    torch._dynamo.reset()
    counters.clear()
    model = random_model(model_config_from_preset(preset), seed=3, dtype=dtype, device="cuda")
    runner = ModelRunner(
        model,
        config,
        cache_config=CacheConfig(max_num_reqs=24, max_context_len=96),
        attention_backend="triton",
        kernel_backend=kernel_backend,
    )
    try:
        assert runner.kernels.name == "triton"
        runner.init_cuda_graphs()
        yield runner
    finally:
        runner.shutdown()
        torch._dynamo.reset()


def shrinking_workload(count: int = 17, seed: int = 0) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompt ``i`` wants ``i + 1`` tokens, so the decode batch walks down through every size from ``count - 1``."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 24, (count,), generator=generator).tolist()
    prompts = [torch.randint(0, 512, (n,), generator=generator).tolist() for n in lengths]
    return prompts, [SamplingParams(max_new_tokens=i + 1) for i in range(count)]


def tokens(model_runner: ModelRunner, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    return [output.output_token_ids for output in generate(model_runner, prompts, params, max_prefill_tokens=100)]


def decode_backend(model_runner: ModelRunner) -> TcPiecewiseCudaGraphBackend:
    runner = model_runner.decode_cuda_graph_runner
    assert runner is not None and isinstance(runner.backend, TcPiecewiseCudaGraphBackend)
    return runner.backend


@pytest.mark.parametrize("compiler", COMPILERS)
@pytest.mark.parametrize("preset", PRESETS)
def test_tc_piecewise_over_the_triton_set_decodes_eager_tokens_at_every_bucket(preset: str, compiler: str) -> None:
    prompts, params = shrinking_workload()
    with engine(preset, graphs(Backend.DISABLED)) as eager:
        expected = tokens(eager, prompts, params)
    with engine(preset, graphs(Backend.TC_PIECEWISE, compiler)) as graphed:
        backend = decode_backend(graphed)
        num_layers = graphed.model.config.num_layers
        assert backend.compile_stats.pieces == backend.compile_stats.split_ops + 1 == num_layers + 1
        assert backend.shapes == DECODE_BUCKETS
        got = tokens(graphed, prompts, params)
        replays = graphed.cuda_graph_metrics[Phase.DECODE].replays_by_size
        assert all(replays[size] > 0 for size in range(1, 17)), f"a batch size ran eagerly: {replays}"
        assert backend.compile_stats.compilations == 1, "the forward recompiled while decoding"
        assert dict(counters["graph_break"]) == {}
    for index, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert have == want, f"prompt {index} diverged ({preset}, {compiler})"


@pytest.mark.parametrize("compiler", COMPILERS)
def test_tc_piecewise_over_the_triton_set_prefills_and_decodes_eager_tokens(compiler: str) -> None:
    """Prefill token buckets (several prompts a step, padded) and decode, both tc_piecewise over the Triton set."""
    prompts, params = shrinking_workload(count=9, seed=1)
    with engine("tiny-qwen3-random", graphs(Backend.DISABLED)) as eager:
        expected = tokens(eager, prompts, params)
    config = graphs(Backend.TC_PIECEWISE, compiler, prefill=Backend.TC_PIECEWISE)
    with engine("tiny-qwen3-random", config) as graphed:
        prefill_runner = graphed.prefill_cuda_graph_runner
        assert prefill_runner is not None and isinstance(prefill_runner.backend, TcPiecewiseCudaGraphBackend)
        got = tokens(graphed, prompts, params)
        assert prefill_runner.backend.compile_stats.compilations == 1
    assert got == expected


@pytest.mark.parametrize("compiler", COMPILERS)
def test_five_batch_sizes_replay_on_at_most_two_compilations_and_match_eager(compiler: str) -> None:
    with engine("tiny-qwen3-random", graphs(Backend.TC_PIECEWISE, compiler)) as graphed:
        runner = graphed.decode_cuda_graph_runner
        assert runner is not None
        backend = decode_backend(graphed)
        for batch_size in FIVE_BATCH_SIZES:
            batch = synthetic_decode_batch(graphed, batch_size, context_len=40, seed=batch_size)
            try:
                assert runner.can_run(batch)
                expected = graphed.forward(batch).clone()
                for _ in range(5):
                    got = runner.replay(batch)
                torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
            finally:
                release_synthetic_batch(graphed, batch, context_len=40)
        assert backend.compile_stats.compilations <= 2
        assert backend.compile_stats.recompiles_at_replay == 0
        assert dict(counters["graph_break"]) == {}


@pytest.mark.parametrize("compiler", COMPILERS)
def test_a_replay_over_the_triton_set_never_enters_dynamo_fx_or_a_guard(compiler: str) -> None:
    with engine("tiny-qwen3-random", graphs(Backend.TC_PIECEWISE, compiler)) as graphed:
        runner = graphed.decode_cuda_graph_runner
        assert runner is not None
        stats = decode_backend(graphed).compile_stats
        batch = synthetic_decode_batch(graphed, 5, context_len=40, seed=5)
        try:
            expected = graphed.forward(batch).clone()
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
            assert entered == [], f"a replay ran dynamo or FX code (a guard, a recompile): {entered[:5]}"
            assert stats.compilations == 1
        finally:
            release_synthetic_batch(graphed, batch, context_len=40)


def test_auto_picks_the_triton_set_for_tc_piecewise_on_cuda() -> None:
    with engine("tiny-llama-random", graphs(Backend.TC_PIECEWISE, "eager"), kernel_backend="auto") as graphed:
        assert graphed.kernels.name == "triton" and graphed.model.kernels is graphed.kernels
        assert decode_backend(graphed).compile_stats.compilations == 1


@pytest.mark.parametrize("compiler", COMPILERS)
def test_bf16_replays_stay_within_bf16_rounding_of_eager_and_keep_greedy_tokens(compiler: str) -> None:
    """The compiled forward calls the same Triton kernels as eager (inductor only compiles the glue between them),
    so bf16 logits stay within bf16 rounding of eager's (the KV store moves from the rotary kernel to the attention
    op's prefix, which copies the same values), and greedy tokens match over 16 steps."""
    prompts, _ = shrinking_workload(count=4, seed=7)
    params = [SamplingParams(max_new_tokens=16) for _ in prompts]
    with engine("tiny-qwen3-random", graphs(Backend.DISABLED), dtype="bfloat16") as eager:
        expected_tokens = tokens(eager, prompts, params)
    with engine("tiny-qwen3-random", graphs(Backend.TC_PIECEWISE, compiler), dtype="bfloat16") as graphed:
        runner = graphed.decode_cuda_graph_runner
        assert runner is not None
        for batch_size in (1, 4):
            batch = synthetic_decode_batch(graphed, batch_size, context_len=40, seed=batch_size)
            try:
                expected = graphed.forward(batch).clone()
                got = runner.replay(batch).clone()
            finally:
                release_synthetic_batch(graphed, batch, context_len=40)
            torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)
        got_tokens = tokens(graphed, prompts, params)
    assert got_tokens == expected_tokens
