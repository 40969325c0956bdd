"""Lean breaks on a real GPU: a breakable decode replay calls each attention break's bound kernel call (no op
dispatch, no ``backend.forward``), computes what the dispatched op computes bit for bit, and matches eager, with both
attention backends; and FlashInfer's bound launch is the direct kernel call and equals ``wrapper.run``. The host-cost
measurement and the device timeline of the engine's decode timing are the harness's: ``tests/gpu/bench``.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections import Counter
from collections.abc import Iterator
from unittest import mock

import pytest
import torch
from attention_params import attention_params
from test_gpu_engine_graphs import (
    BF16_LOGITS,
    EAGER,
    FLASHINFER_MODEL,
    NO_FLASHINFER,
    decode_batch_of_lengths,
    engine,
    fill_cache,
    release_decode_batch,
)

from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
from cudagraph.engine.batch import Request, SamplingParams, make_extend_batch
from cudagraph.engine.testing import DispatchedOps, unbound_attention
from cudagraph.runner import ReplayMetadata

pytestmark = pytest.mark.gpu

FAST_DECODE_PLAN = not NO_FLASHINFER and hasattr(importlib.import_module("flashinfer.decode"), "fast_decode_plan")
"""The FlashInfer here re-plans a graph wrapper without copying its page metadata."""

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
BREAKABLE_DECODE = CudaGraphConfig(
    decode=PhaseConfig(Backend.BREAKABLE, BUCKETS, 64), prefill=PhaseConfig(Backend.DISABLED, (), 0)
)
ATTENTION = {
    "torch": {"preset": "tiny-qwen3-random", "dtype": "float32"},
    "flashinfer": {"preset": FLASHINFER_MODEL, "dtype": "bfloat16"},
    "triton": {"preset": FLASHINFER_MODEL, "dtype": "bfloat16"},
}


@pytest.fixture
def dispatched_attention() -> Iterator[None]:
    """``unified_attention`` without its replay binder while the fixture is active (replay then calls the op)."""
    with unbound_attention():
        yield


def context_lens(batch_size: int, seed: int) -> list[int]:
    return torch.randint(0, 150, (batch_size,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("attention", attention_params())
def test_breakable_replay_calls_bound_breaks_only_and_matches_eager(attention: str) -> None:
    setup = ATTENTION[attention]
    with engine(setup["preset"], BREAKABLE_DECODE, attention=attention, dtype=setup["dtype"]) as graphed:
        fill_cache(graphed, seed=21)
        runner = graphed.decode_cuda_graph_runner
        assert runner is not None
        layers = graphed.shape.num_layers
        assert all(runner.backend.entry(bucket).graph.num_eager_calls == layers for bucket in BUCKETS)
        for batch_size in (1, 3, 8, 17, 40, 64):
            batch = decode_batch_of_lengths(graphed, context_lens(batch_size, batch_size), seed=batch_size)
            counter = DispatchedOps()
            watched = mock.patch.object(graphed.attn_backend, "forward", wraps=graphed.attn_backend.forward)
            with watched as forward, counter:
                have = runner.replay(batch).clone()
            assert forward.call_count == 0, "a replayed break must not go through backend.forward"
            assert counter.calls["cudagraph_engine.unified_attention"] == 0
            assert counter.calls["cudagraph_engine.store_kv"] == 0, "storing keys and values is inside the graph"
            want = graphed.forward(batch)
            torch.testing.assert_close(have, want, **BF16_LOGITS, msg=f"batch size {batch_size}")
            assert torch.equal(have.argmax(-1), want.argmax(-1)), f"batch size {batch_size}: greedy tokens differ"
            release_decode_batch(graphed, batch)


@pytest.mark.parametrize("attention", attention_params())
def test_bound_and_dispatched_breakable_replays_agree_bit_for_bit(attention: str, request) -> None:
    setup = ATTENTION[attention]

    def replayed_logits() -> list[torch.Tensor]:
        with engine(setup["preset"], BREAKABLE_DECODE, attention=attention, dtype=setup["dtype"]) as graphed:
            fill_cache(graphed, seed=22)
            runner = graphed.decode_cuda_graph_runner
            assert runner is not None
            results = []
            for batch_size in (1, 5, 16, 64):
                batch = decode_batch_of_lengths(graphed, context_lens(batch_size, 100 + batch_size), seed=batch_size)
                results.append(runner.replay(batch).clone())
                release_decode_batch(graphed, batch)
            return results

    bound = replayed_logits()
    request.getfixturevalue("dispatched_attention")
    dispatched = replayed_logits()
    for have, want in zip(bound, dispatched, strict=True):
        assert torch.equal(have, want)


@pytest.mark.skipif(
    NO_FLASHINFER,
    reason=(
        "flashinfer is not installed: pip install flashinfer-python into the GPU interpreter (or "
        "put its wheels in .whl/, which `nox -s gpu` unpacks)"
    ),
)
@pytest.mark.parametrize("batch_size", [1, 7, 32])
def test_flashinfer_bound_launch_is_the_direct_kernel_call_and_equals_wrapper_run(batch_size: int) -> None:
    from cudagraph.engine.kernels.flashinfer.decode_attention import bind_decode_run
    from cudagraph.engine.kernels.flashinfer.private_api import direct_decode_launch

    with engine(FLASHINFER_MODEL, EAGER, attention="flashinfer", dtype="bfloat16") as flash:
        fill_cache(flash, seed=23)
        shape, attn_backend = flash.shape, flash.attn_backend
        batch = decode_batch_of_lengths(flash, context_lens(batch_size, 7), seed=batch_size)
        attn_backend.init_forward_metadata_replay_cuda_graph(ReplayMetadata.of_batch(batch))
        wrapper = attn_backend.decode_wrapper.wrapper
        q = torch.randn(batch_size, shape.num_heads * shape.head_dim, device="cuda").to(torch.bfloat16)
        want, have = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
        query, paged_kv, out = attn_backend._decode_views(q, want, shape.num_layers - 1)
        wrapper.run(query, paged_kv, out=out)
        query, paged_kv, out = attn_backend._decode_views(q, have, shape.num_layers - 1)
        direct = direct_decode_launch(wrapper, query, paged_kv, out)
        assert direct is not None, "the graph wrapper binds the kernel itself"
        bind_decode_run(wrapper, query, paged_kv, out)()
        assert torch.equal(have, want)
        release_decode_batch(flash, batch)


FULL_DECODE = CudaGraphConfig(
    decode=PhaseConfig(Backend.FULL, BUCKETS, 64), prefill=PhaseConfig(Backend.DISABLED, (), 0)
)


@pytest.mark.skipif(
    NO_FLASHINFER,
    reason=(
        "flashinfer is not installed: pip install flashinfer-python into the GPU interpreter (or "
        "put its wheels in .whl/, which `nox -s gpu` unpacks)"
    ),
)
def test_flashinfer_replay_planning_launches_no_kernel_and_full_decode_matches_eager() -> None:
    """A decode graph lays its page table, indptr and last-page lengths out inside the graph, so re-planning it before
    a replay is host work and FlashInfer's one copy of its plan info: no gather or scatter kernel, no copy of the page
    metadata (where FlashInfer has ``fast_decode_plan``). The graphs still match eager."""
    with engine(FLASHINFER_MODEL, FULL_DECODE, attention="flashinfer", dtype="bfloat16") as graphed:
        fill_cache(graphed, seed=23)
        runner = graphed.decode_cuda_graph_runner
        assert runner is not None
        for batch_size in (1, 5, 17, 64):
            batch = decode_batch_of_lengths(graphed, context_lens(batch_size, 100 + batch_size), seed=batch_size)
            bucket = runner.bucket_of(batch)
            assert bucket is not None
            static = runner.static_buckets[bucket].batch
            runner.static_buffers.copy_in(batch, batch_size, batch_size)
            torch.cuda.synchronize()
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities) as profiler:
                graphed.attn_backend.init_forward_metadata_replay_cuda_graph(
                    ReplayMetadata(
                        bucket,
                        static.req_pool_indices,
                        static.seq_lens,
                        batch.seq_lens_sum + (bucket - batch_size),
                        batch.forward_mode,
                        static.seq_lens_cpu,
                    )
                )
                torch.cuda.synchronize()
            device_work = [e.name for e in profiler.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            kernels = [name for name in device_work if not name.lower().startswith(("memcpy", "memset"))]
            assert kernels == [], f"batch size {batch_size}: planning launched {kernels}"
            if FAST_DECODE_PLAN:
                # The graph writes indptr and the last-page lengths too: only FlashInfer's own plan info is copied.
                copies = [name for name in device_work if name.lower().startswith("memcpy")]
                assert len(copies) <= 1, f"batch size {batch_size}: re-planning copied {device_work}"
            have = runner.replay(batch).clone()
            want = graphed.forward(batch)
            torch.testing.assert_close(have, want, **BF16_LOGITS, msg=f"batch size {batch_size}")
            assert torch.equal(have.argmax(-1), want.argmax(-1)), f"batch size {batch_size}: greedy tokens differ"
            release_decode_batch(graphed, batch)


@pytest.mark.parametrize("attention", ["torch", "triton"])
def test_a_full_replay_of_a_batch_written_in_place_launches_only_the_graph(attention: str) -> None:
    """A decode step written into the runner's input views replays with one CUDA call, the graph launch (no input
    copy, no kernel), and gives the logits of the same step copied in and of eager."""
    setup = ATTENTION[attention]
    with engine(setup["preset"], FULL_DECODE, attention=attention, dtype=setup["dtype"]) as graphed:
        fill_cache(graphed, seed=29)
        runner = graphed.decode_cuda_graph_runner
        assert runner is not None
        for batch_size in (1, 5, 64):
            batch = decode_batch_of_lengths(graphed, context_lens(batch_size, 200 + batch_size), seed=batch_size)
            copied = runner.replay(batch).clone()
            views = runner.input_views(batch_size)
            assert views is not None
            for name, view in views.items():
                view.copy_(getattr(batch, name))
            in_place = dataclasses.replace(batch, **views)
            torch.cuda.synchronize()
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities) as profiler:
                have = runner.replay(in_place)
                torch.cuda.synchronize()
            calls = sorted(
                e.name for e in profiler.events() if e.name.startswith(("cuda", "cu")) and "Synchronize" not in e.name
            )
            launches = [name for name in calls if "Launch" in name or "Memcpy" in name or "Memset" in name]
            assert launches == ["cudaGraphLaunch"], f"batch size {batch_size}: {calls}"
            torch.testing.assert_close(have, copied, rtol=0, atol=0)
            want = graphed.forward(batch)
            tolerance = BF16_LOGITS if setup["dtype"] == "bfloat16" else {"rtol": 1e-4, "atol": 1e-4}
            torch.testing.assert_close(have, want, **tolerance, msg=f"batch size {batch_size}")
            release_decode_batch(graphed, batch)


GREEDY = SamplingParams(max_new_tokens=1)
BREAKABLE_PREFILL = CudaGraphConfig(
    decode=PhaseConfig(Backend.DISABLED, (), 0), prefill=PhaseConfig(Backend.BREAKABLE, (16, 32, 64), 64)
)


def cuda_calls(step) -> Counter[str]:
    """The CUDA runtime and driver calls ``step()`` makes, by name (synchronization left out)."""
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profiler:
        step()
        torch.cuda.synchronize()
    return Counter(e.name for e in profiler.events() if e.name.startswith("cu") and "Synchronize" not in e.name)


@pytest.mark.parametrize("lengths", [[5, 9], [30, 20, 7]])
def test_a_breakable_prefill_replay_written_in_place_drops_exactly_the_input_copies(lengths: list[int]) -> None:
    """An extend step written into the prefill runner's input views replays what the copied step replays, minus its
    two fused input copies (one per dtype), and gives the same logits bit for bit."""
    setup = ATTENTION["triton"]
    with engine(setup["preset"], BREAKABLE_PREFILL, attention="triton", dtype=setup["dtype"]) as graphed:
        runner = graphed.prefill_cuda_graph_runner
        assert runner is not None
        generator = torch.Generator().manual_seed(len(lengths))
        vocab = graphed.model.config.vocab_size
        requests = [
            graphed.hold(Request(index, torch.randint(0, vocab, (length,), generator=generator).tolist(), GREEDY))
            for index, length in enumerate(lengths)
        ]
        try:
            copied_batch = make_extend_batch(requests, graphed.device)
            runner.replay(copied_batch)  # warm: first-use work out of the profiles
            copied_logits: list[torch.Tensor] = []
            copied = cuda_calls(lambda: copied_logits.append(runner.replay(copied_batch).clone()))
            views = runner.input_views(sum(lengths), len(lengths))
            assert views is not None
            in_place_batch = make_extend_batch(requests, graphed.device, into=views)
            in_place_logits: list[torch.Tensor] = []
            in_place = cuda_calls(lambda: in_place_logits.append(runner.replay(in_place_batch).clone()))
        finally:
            for request in requests:
                graphed.release(request)
    print(f"\ncopied: {dict(copied)}\nin place: {dict(in_place)}")
    assert copied - in_place == Counter({"cudaLaunchKernel": 2}), f"copied {copied}, in place {in_place}"
    assert in_place - copied == Counter()
    torch.testing.assert_close(in_place_logits[0], copied_logits[0], rtol=0, atol=0)
