"""A step is routed once: the engine asks its runner for the step's route and input views together
(``step_inputs``) before building the batch, the batch carries the route, and the runner's replay takes it as given.
Counted as reads of the runner's route table, per engine step, for steps that replay and steps that run eagerly."""

from __future__ import annotations

import pytest
import torch
from runner_helpers import admit, graph_config, make_model_runner, prefill_eagerly, prompts_of

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.config import Backend
from cudagraph.engine.batch import make_decode_batch, make_extend_batch
from cudagraph.runner import DecodeCudaGraphRunner, EagerReason, PrefillCudaGraphRunner


class CountingRoutes(list):
    """A runner's routes by size, counting the lookups."""

    lookups = 0

    def __getitem__(self, index):
        type(self).lookups += 1
        return super().__getitem__(index)


def count_lookups(runner) -> type[CountingRoutes]:
    counting = type("Counting", (CountingRoutes,), {"lookups": 0})
    runner.static_buckets.by_size = counting(runner.static_buckets.by_size)
    return counting


@pytest.mark.parametrize(("disable_padding", "replays"), [(False, True), (True, False)])
def test_a_decode_step_through_the_engine_reads_its_route_once(disable_padding: bool, replays: bool) -> None:
    model_runner = make_model_runner(config=graph_config(disable_padding=disable_padding))
    runner = DecodeCudaGraphRunner(
        model_runner, model_runner.cuda_graph_config, backend=CpuReplayBackend(), show_progress=False
    )
    runner.capture()
    model_runner.decode_cuda_graph_runner = runner
    requests = admit(model_runner, prompts_of([3, 5, 4], seed=1))
    prefill_eagerly(model_runner, requests)
    eager = model_runner.forward(make_decode_batch(requests, model_runner.device)).clone()
    counting = count_lookups(runner)
    batch = model_runner.decode_batch(requests)  # 3 requests: bucket 4, or eager when padding is off
    logits = model_runner.run(batch)
    assert counting.lookups == 1
    in_place = batch.input_ids.data_ptr() == runner.static_buffers.tensors["input_ids"].data_ptr()
    assert (batch.route.bucket is not None) is replays and in_place is replays
    assert runner.metrics.replays == int(replays)
    assert runner.metrics.eager_count(EagerReason.NOT_A_BUCKET) == int(not replays)
    torch.testing.assert_close(logits, eager, rtol=1e-5, atol=1e-5)


def test_an_extend_step_through_the_engine_reads_its_route_once() -> None:
    model_runner = make_model_runner()
    runner = PrefillCudaGraphRunner(
        model_runner, model_runner.cuda_graph_config, backend=CpuReplayBackend(Backend.BREAKABLE), show_progress=False
    )
    runner.capture()
    model_runner.prefill_cuda_graph_runner = runner
    requests = admit(model_runner, prompts_of([7, 11, 3], seed=2))
    eager = model_runner.forward(make_extend_batch(requests, model_runner.device)).clone()
    counting = count_lookups(runner)
    logits = model_runner.run(model_runner.extend_batch(requests))
    assert counting.lookups == 1 and runner.metrics.replays == 1
    torch.testing.assert_close(logits, eager, rtol=1e-5, atol=1e-5)


def test_a_batch_built_without_a_route_is_routed_when_it_runs() -> None:
    model_runner = make_model_runner()
    runner = DecodeCudaGraphRunner(
        model_runner, model_runner.cuda_graph_config, backend=CpuReplayBackend(), show_progress=False
    )
    runner.capture()
    requests = admit(model_runner, prompts_of([3, 5], seed=3))
    prefill_eagerly(model_runner, requests)
    batch = make_decode_batch(requests, model_runner.device)
    assert batch.route is None
    counting = count_lookups(runner)
    runner.replay(batch)
    assert counting.lookups == 1 and runner.metrics.replays == 1
