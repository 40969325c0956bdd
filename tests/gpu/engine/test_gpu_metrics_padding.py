"""The padding policy and the replay metrics on a real GPU: decode buckets 1, 2, 4, 8 with max_padding_ratio 1.5,
one step of every batch size 1..10 through the engine's ``run``.

Each step goes where the rules say (3 -> bucket 4, ratio 1.33, replays; 5 -> bucket 8, ratio 1.6, eager over-padded;
9 and 10 eager, larger than the largest bucket), the metrics count exactly those steps by reason, and every step's
logits equal the eager forward's (float32, random weights, the same KV cache).
"""

from __future__ import annotations

import pytest
import torch
from test_gpu_engine_graphs import decode_batch_of_lengths, engine, fill_cache, release_decode_batch

from cudagraph.config import Backend, CudaGraphConfig, Phase, PhaseConfig
from cudagraph.runner import EagerReason


def padding_config(backend: Backend) -> CudaGraphConfig:
    return CudaGraphConfig(
        decode=PhaseConfig(backend, (1, 2, 4, 8), 8, max_padding_ratio=1.5),
        prefill=PhaseConfig(Backend.DISABLED, (), 0),
    )


ROUTES = {
    1: (1, None),
    2: (2, None),
    3: (4, None),
    4: (4, None),
    5: (None, EagerReason.OVER_PADDED),
    6: (8, None),
    7: (8, None),
    8: (8, None),
    9: (None, EagerReason.TOO_LARGE),
    10: (None, EagerReason.TOO_LARGE),
}
"""Batch size -> (bucket replayed, or None and the reason it ran eagerly)."""


@pytest.mark.gpu
@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE])
def test_each_step_goes_where_the_padding_policy_says_and_is_counted(backend: Backend) -> None:
    with engine("tiny-qwen3-random", padding_config(backend)) as model_runner:
        runner = model_runner.decode_cuda_graph_runner
        assert runner is not None and runner.captured_buckets == (1, 2, 4, 8)
        fill_cache(model_runner, seed=7)
        for size in range(1, 11):
            batch = decode_batch_of_lengths(model_runner, [5 + 3 * row for row in range(size)], seed=size)
            route = runner.route(batch)
            assert (route.bucket, route.reason) == ROUTES[size], f"batch size {size}"
            want = model_runner.forward(batch).clone()
            have = model_runner.run(batch).clone()
            torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-4, msg=f"batch size {size}")
            assert torch.equal(have.argmax(-1), want.argmax(-1)), f"batch size {size}: greedy tokens differ"
            release_decode_batch(model_runner, batch)
        metrics = model_runner.cuda_graph_metrics[Phase.DECODE]
        replays = {row.bucket: row.replays for row in metrics.bucket_rows()}
        eager = {row.reason: row.steps for row in metrics.eager_rows()}
        print(metrics.table())
    want_replays = {bucket: 0 for bucket in (1, 2, 4, 8)}
    for bucket, _ in ROUTES.values():
        if bucket is not None:
            want_replays[bucket] += 1
    assert replays == want_replays == {1: 1, 2: 1, 4: 2, 8: 3}
    assert eager == {EagerReason.OVER_PADDED: 1, EagerReason.TOO_LARGE: 2}
    assert metrics.steps == len(ROUTES)
