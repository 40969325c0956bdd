"""The prefill runner against the real engine on the CPU, through the breakable test double."""

from __future__ import annotations

import pytest
import torch
from runner_helpers import admit, make_model_runner, prefill_eagerly, prompts_of

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.config import Backend
from cudagraph.engine.batch import SamplingParams, make_decode_batch, make_extend_batch
from cudagraph.engine.generate import generate
from cudagraph.runner import DecodeCudaGraphRunner, PrefillCudaGraphRunner, ReplayMetadata


def captured_prefill_runner(model_runner) -> tuple[PrefillCudaGraphRunner, CpuReplayBackend]:
    backend = CpuReplayBackend(Backend.BREAKABLE)
    runner = PrefillCudaGraphRunner(model_runner, model_runner.cuda_graph_config, backend=backend, show_progress=False)
    runner.capture()
    return runner, backend


# one request and three into larger buckets in `nox -s tests`; the other shapes `slow`
@pytest.mark.parametrize(
    ("lengths", "bucket"),
    [
        ([5], 16),
        pytest.param([5, 9], 16, marks=pytest.mark.slow),
        pytest.param([16], 16, marks=pytest.mark.slow),
        ([7, 11, 3], 32),
        pytest.param([30, 20], 64, marks=pytest.mark.slow),
    ],
)
def test_extend_replay_matches_eager(lengths: list[int], bucket: int) -> None:
    model_runner = make_model_runner()
    runner, backend = captured_prefill_runner(model_runner)
    assert backend.captured_order == [64, 32, 16]
    requests = admit(model_runner, prompts_of(lengths))
    batch = make_extend_batch(requests, model_runner.device)
    eager = model_runner.forward(batch).clone()
    replayed = runner.replay(batch)
    assert backend.replayed == [bucket]
    assert replayed.shape == (len(lengths), model_runner.model.config.vocab_size)
    torch.testing.assert_close(replayed, eager, rtol=1e-5, atol=1e-5)


def test_chunked_extend_over_a_cached_prefix_matches_eager() -> None:
    model_runner = make_model_runner()
    runner, backend = captured_prefill_runner(model_runner)
    requests = admit(model_runner, prompts_of([12, 6], seed=3))
    full_prompts = [list(r.prompt_ids) for r in requests]
    for request in requests:  # cache the first half of each prompt, extend the rest
        request.prompt_ids = request.prompt_ids[: len(request.prompt_ids) // 2]
    prefill_eagerly(model_runner, requests)
    for request, prompt in zip(requests, full_prompts, strict=True):
        request.prompt_ids, request.output_ids = prompt, []
    batch = make_extend_batch(requests, model_runner.device)
    assert batch.extend_prefix_lens_cpu == [6, 3]
    eager = model_runner.forward(batch).clone()
    torch.testing.assert_close(runner.replay(batch), eager, rtol=1e-5, atol=1e-5)
    assert backend.replayed == [16]


def test_prefill_runner_leaves_what_it_cannot_take_to_eager() -> None:
    model_runner = make_model_runner()
    runner, backend = captured_prefill_runner(model_runner)
    too_long = make_extend_batch(admit(model_runner, prompts_of([40, 30])), model_runner.device)
    assert not runner.can_run(too_long)
    torch.testing.assert_close(runner.replay(too_long), model_runner.forward(too_long))
    requests = admit(model_runner, prompts_of([4]))
    prefill_eagerly(model_runner, requests)
    assert not runner.can_run(make_decode_batch(requests, model_runner.device))
    assert backend.replayed == []


@pytest.mark.parametrize("preset", ["tiny-qwen3-random", pytest.param("tiny-llama-random", marks=pytest.mark.slow)])
def test_generate_with_both_runners_gives_the_eager_tokens(preset: str) -> None:
    prompts = prompts_of([3, 17, 8, 1, 25, 9, 4, 12, 6, 2], seed=7)
    # Different lengths make the decode batch shrink through several buckets (and start above the largest).
    params = [SamplingParams(max_new_tokens=n) for n in (2, 9, 4, 6, 3, 8, 5, 7, 2, 10)]
    eager_runner = make_model_runner(preset)
    expected = [out.output_token_ids for out in generate(eager_runner, prompts, params)]

    graphed = make_model_runner(preset)
    decode_backend, prefill_backend = CpuReplayBackend(Backend.FULL), CpuReplayBackend(Backend.BREAKABLE)
    config = graphed.cuda_graph_config
    graphed.decode_cuda_graph_runner = DecodeCudaGraphRunner(
        graphed, config, backend=decode_backend, show_progress=False
    )
    graphed.prefill_cuda_graph_runner = PrefillCudaGraphRunner(
        graphed, config, backend=prefill_backend, show_progress=False
    )
    graphed.decode_cuda_graph_runner.capture()
    graphed.prefill_cuda_graph_runner.capture()
    got = [out.output_token_ids for out in generate(graphed, prompts, params, max_prefill_tokens=32)]
    assert got == expected
    assert [len(tokens) for tokens in got] == [p.max_new_tokens for p in params]
    # Both runners really replayed, and at more than one bucket.
    assert len(set(decode_backend.replayed)) > 1
    assert prefill_backend.replayed


@pytest.mark.parametrize(("backend", "in_graph"), [(Backend.FULL, True), (Backend.BREAKABLE, False)])
def test_the_attention_hooks_hear_whether_attention_is_inside_the_graph(backend: Backend, in_graph: bool) -> None:
    """Prefill full captures attention, so the attention backend must plan static per-bucket state for it; the
    breakable backend runs attention as an eager break, planned per step for the real requests only."""
    model_runner = make_model_runner()
    attn_backend = model_runner.attn_backend
    heard: list[tuple[str, object, object]] = []
    capture_hook = attn_backend.init_forward_metadata_capture_cuda_graph
    replay_hook = attn_backend.init_forward_metadata_replay_cuda_graph

    def on_capture(*args, **kwargs):
        heard.append(("capture", kwargs.get("attention_in_graph"), kwargs.get("forward_batch")))
        return capture_hook(*args, **kwargs)

    def on_replay(metadata: ReplayMetadata) -> None:
        heard.append(("replay", metadata.attention_in_graph, metadata.forward_batch))
        return replay_hook(metadata)

    attn_backend.init_forward_metadata_capture_cuda_graph = on_capture
    attn_backend.init_forward_metadata_replay_cuda_graph = on_replay
    runner = PrefillCudaGraphRunner(
        model_runner, model_runner.cuda_graph_config, backend=CpuReplayBackend(backend), show_progress=False
    )
    runner.capture()
    assert runner.attention_in_graph is in_graph
    runner.replay(make_extend_batch(admit(model_runner, prompts_of([5, 9])), model_runner.device))
    assert [(kind, flag) for kind, flag, _ in heard] == [("capture", in_graph)] * 3 + [("replay", in_graph)]
    assert heard[-1][2] is runner.static_buckets[16].batch, "the replay hook plans from the bucket's static batch"
