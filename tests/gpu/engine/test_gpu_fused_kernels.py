"""The engine with a fused kernel set (FlashInfer's, Triton's), FlashInfer attention: full and breakable decode graphs
give eager's tokens at every batch size 1..64, and a decode step launches at most the budgeted kernels per decoder
layer.

bfloat16 throughout (the fused kernels exist for float16 and bfloat16 only). Graphs are compared with eager runs of
the same kernels: every fused kernel computes a token's row the same way whatever the batch, so padding a batch to
its bucket changes none of the real rows.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections import Counter
from collections.abc import Iterator

import pytest
import torch
from test_gpu_engine_graphs import (
    EAGER,
    assert_decode_replay_matches_eager,
    config,
    fill_cache,
    mixed_length_decode_batches,
    replayed_batch_sizes,
    shrinking_workload,
    tokens,
)

from cudagraph.config import Backend, CudaGraphConfig
from cudagraph.engine.model import ModelConfig, model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.engine.testing import release_synthetic_batch, synthetic_decode_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        importlib.util.find_spec("flashinfer") is None,
        reason=(
            "flashinfer is not installed: pip install flashinfer-python into the GPU interpreter (or "
            "put its wheels in .whl/, which `nox -s gpu` unpacks)"
        ),
    ),
]

FUSED_MODELS = {
    # FlashInfer's kernels need head_dim 64, 128, 256 or 512; the tiny presets use 32 and 16.
    "qwen3": model_config_from_preset("tiny-qwen3-random").with_overrides(head_dim=64, torch_dtype="bfloat16"),
    "llama": model_config_from_preset("tiny-llama-random").with_overrides(head_dim=64, torch_dtype="bfloat16"),
}


FUSED_SETS = ["flashinfer", "triton"]
"""The fused kernel sets (Triton ships with CUDA builds of torch; the module needs flashinfer for attention)."""


@contextlib.contextmanager
def fused_engine(
    model_config: ModelConfig,
    graphs: CudaGraphConfig,
    attention: str,
    cache: CacheConfig | None = None,
    kernels: str = "flashinfer",
) -> Iterator[ModelRunner]:
    """A bfloat16 CUDA engine on the fused ``kernels``, graphs captured; shut down on exit, pass or fail."""
    model = random_model(model_config, seed=3, dtype="bfloat16", device="cuda")
    cache = cache or CacheConfig(max_num_reqs=80, max_context_len=160)
    runner = ModelRunner(model, graphs, cache_config=cache, attention_backend=attention, kernel_backend=kernels)
    assert runner.kernels.name == kernels and model.kernels is runner.kernels
    try:
        runner.init_cuda_graphs()
        yield runner
    finally:
        runner.shutdown()


FUSED_PATHS = [("flashinfer", "flashinfer"), ("triton", "flashinfer"), ("triton", "triton")]
"""(kernel set, attention backend) pairs whose decode computes a row the same way in any batch."""


@pytest.mark.parametrize(("kernels", "attention"), FUSED_PATHS)
@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE])
@pytest.mark.parametrize("name", list(FUSED_MODELS))
def test_fused_decode_graphs_give_eager_tokens_at_every_batch_size(
    name: str, backend: Backend, kernels: str, attention: str
) -> None:
    """With FlashInfer attention (one CTA per row: a padded batch attends each real row as eager does) or Triton's
    (a row's splits follow its length only). The torch attention backend sizes eager and graphed decode attention
    differently, which moves bfloat16 roundings by itself; its graphs are compared by logits in
    test_gpu_engine_graphs."""
    prompts, params = shrinking_workload()
    with fused_engine(FUSED_MODELS[name], EAGER, attention, kernels=kernels) as eager:
        expected = tokens(eager, prompts, params)
    with fused_engine(FUSED_MODELS[name], config(backend, Backend.DISABLED), attention, kernels=kernels) as graphed:
        assert graphed.decode_cuda_graph_runner is not None
        got = tokens(graphed, prompts, params)
        seen = replayed_batch_sizes(graphed.decode_cuda_graph_runner)
    assert seen == list(range(1, 65)), "every decode batch size 1..64 should have replayed a graph"
    for index, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert have == want, f"prompt {index} diverged"


@pytest.mark.parametrize("kernels", FUSED_SETS)
@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE])
def test_fused_decode_graph_logits_equal_eager_logits_at_every_batch_size(backend: Backend, kernels: str) -> None:
    """Requests of mixed lengths at every batch size 1..64 (padding included): replayed logits within bfloat16
    rounding of eager ones and the same greedy tokens."""
    graphs = config(backend, Backend.DISABLED)
    with fused_engine(FUSED_MODELS["qwen3"], graphs, "flashinfer", kernels=kernels) as engine:
        fill_cache(engine, seed=11)
        for batch in mixed_length_decode_batches(engine, seed=11):
            assert_decode_replay_matches_eager(engine, batch)


# -- kernels per decoder layer --------------------------------------------------------------------------------------

LAYER_SHAPE = model_config_from_preset("qwen3-0.6b-random").with_overrides(vocab_size=4096, max_position_embeddings=512)
"""Qwen3-0.6B's layer (hidden 1024, 16/8 heads of 128, intermediate 3072); the vocabulary does not matter here."""

KERNEL_BUDGET = {
    ("flashinfer", "llama"): 10,
    ("flashinfer", "qwen3"): 12,
    ("triton", "llama"): 6,
    ("triton", "qwen3"): 6,
}
"""Operations per decoder layer of a batch-1 decode step with FlashInfer attention, by kernel set and family.
FlashInfer's set: attention, the KV store, 4 matmuls, rotary, 2 fused add+norms, silu-and-mul, and for Qwen3 its q
and k head norms, two launches (FlashInfer's head norm takes one weight vector and q and k have their own). Triton's
set: attention, 4 projections (the add + norms fused into the q/k/v and gate/up ones, the activation into the down
one), head norms with rotary and the KV store in one. A library may run one operation as two launches
(``LIBRARY_HELPERS``); those are printed and counted with their operation, not against the budget."""

LIBRARY_HELPERS = {
    "splitKreduce": "cuBLAS split-K matmul reduction",
    "MergeStates": "FlashInfer split-kv decode merge",
}
"""Kernels a library adds to one of our operations, by its own choice of tiling (name fragment: what it is)."""

MATMUL_FRAGMENTS = ("nvjet", "gemm", "gemv", "sm90_xmma", "cutlass")
"""Name fragments of the matmul kernels cuBLAS picks for the projections (and of Triton's ``_gemv_kernel``)."""

FUSED_KERNELS_PER_LAYER = {
    "flashinfer": {
        "FusedAddRMSNormKernel": 2,
        "BatchQKApplyRotaryPosIdsCosSinCache": 1,
        "act_and_mul_kernel": 1,
        "BatchDecodeWithPagedKVCache": 1,
        "QKRMSNormKernel": {"qwen3": 2, "llama": 0},
    },
    "triton": {
        "_rms_norm_kernel": 0,
        "_qk_norm_rope_kernel": 1,
        "_gemv_kernel": 4,
        "BatchDecodeWithPagedKVCache": 1,
        "index_put": 0,
    },
}
"""By kernel set, substrings of kernel names (from the sources) and how many launches of each a layer makes (by
family where the families differ)."""

HELPERS_FORBIDDEN = {"flashinfer": (), "triton": ("splitKreduce",)}
"""Library helpers a set must not launch: Triton's set runs no cuBLAS projection at batch 1 (FlashInfer's decode
may still merge split attention, whichever set computes the rest)."""


def device_activities_of_one_decode_step(
    model_config: ModelConfig, kernels: str, attention: str = "flashinfer"
) -> Counter[str]:
    """Every kernel, copy and memset one eager batch-1 decode step puts on the GPU (what a full graph of the same
    step holds as nodes), by name; measured on a warm engine."""
    from torch.profiler import ProfilerActivity, profile

    cache = CacheConfig(max_num_reqs=2, max_context_len=256)
    with fused_engine(model_config, EAGER, attention, cache, kernels) as engine:
        batch = synthetic_decode_batch(engine, 1, context_len=128)
        engine.forward(batch)  # warm: plans, lazily loaded modules, matmul handles
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as profiler:
            engine.forward(batch)
            torch.cuda.synchronize()
        release_synthetic_batch(engine, batch, 128)
    return Counter(e.name for e in profiler.events() if e.device_type == torch.autograd.DeviceType.CUDA)


@pytest.mark.parametrize("kernels", FUSED_SETS)
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_fused_decoder_layer_launches_at_most_its_kernel_budget(family: str, kernels: str) -> None:
    """What is counted: the difference between a 4-layer and a 2-layer model's decode step, halved: every device
    activity (kernel, memcpy, memset) of two decoder layers, and nothing else (embedding, final norm, LM head,
    attention planning and the step's inputs cancel out)."""
    shape = LAYER_SHAPE.with_overrides(model_type=family)
    two, four = (device_activities_of_one_decode_step(shape.with_overrides(num_layers=n), kernels) for n in (2, 4))
    two_layers = four - two
    assert not two - four, f"a 2-layer step launched something a 4-layer one did not: {two - four}"
    assert all(count % 2 == 0 for count in two_layers.values()), f"not the same per layer: {two_layers}"
    per_layer = {name: count // 2 for name, count in two_layers.items()}
    total = sum(per_layer.values())
    helpers = {name: count for name, count in per_layer.items() if any(f in name for f in LIBRARY_HELPERS)}
    operations = total - sum(helpers.values())
    listing = "\n".join(f"  {count} x {name[:150]}" for name, count in sorted(per_layer.items()))
    print(
        f"\n{family}-shaped decoder layer, {kernels} kernels + FlashInfer attention: {total} launches, {operations} "
        f"operations ({sum(helpers.values())} library helper launches)\n{listing}"
    )
    for fragment, expected in FUSED_KERNELS_PER_LAYER[kernels].items():
        want = expected[family] if isinstance(expected, dict) else expected
        assert sum(count for name, count in per_layer.items() if fragment in name) == want, fragment
    matmuls = sum(count for name, count in per_layer.items() if any(f in name for f in MATMUL_FRAGMENTS))
    assert matmuls == 4, f"one matmul per projection (qkv, o, gate_up, down), found {matmuls}"
    assert all(count <= 2 for count in helpers.values()), f"more library helper launches than expected: {helpers}"
    forbidden = [name for name in helpers if any(fragment in name for fragment in HELPERS_FORBIDDEN[kernels])]
    assert not forbidden, f"the {kernels} set launched {forbidden}"
    assert operations <= KERNEL_BUDGET[(kernels, family)]


TRITON_LAYER = Counter({"_qk_norm_rope_kernel": 1, "_gemv_kernel": 4, "_paged_decode_kernel": 1})
"""A decoder layer of the Triton kernel set with Triton attention: every launch it makes, by kernel name."""


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_the_triton_path_launches_six_kernels_a_layer_and_nothing_else(family: str) -> None:
    """Triton kernels and Triton attention: two layers' device activities (a 4-layer step less a 2-layer one) are
    exactly twice ``TRITON_LAYER``: no library helper, no copy, no memset, no merge kernel."""
    shape = LAYER_SHAPE.with_overrides(model_type=family)
    two, four = (
        device_activities_of_one_decode_step(shape.with_overrides(num_layers=n), "triton", "triton") for n in (2, 4)
    )
    two_layers = four - two
    assert not two - four, f"a 2-layer step launched something a 4-layer one did not: {two - four}"
    per_layer = Counter({name: count // 2 for name, count in two_layers.items()})
    listing = "\n".join(f"  {count} x {name[:150]}" for name, count in sorted(per_layer.items()))
    print(
        f"\n{family}-shaped decoder layer, triton kernels + triton attention: {per_layer.total()} launches\n{listing}"
    )
    assert all(count % 2 == 0 for count in two_layers.values()), f"not the same per layer: {two_layers}"
    assert per_layer == TRITON_LAYER
