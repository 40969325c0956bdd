"""Sleep and wake: ``sleep()`` gives back the graphs (and their pool) and the KV cache, keeping the weights; a step
while asleep is one clear error; ``wake()`` captures again over the same static buffers (all buckets, or on first
use under the lazy policy) and the next step replays; a wake that cannot capture leaves a runner that runs eagerly
and says why."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from runner_helpers import StubModelRunner, captured_runner, decode_batch, make_model_runner, stub_decode_batch
from test_runner_lazy_capture import lazy_config, lazy_runner

from cudagraph.config import Backend, CapturePolicy
from cudagraph.engine.model_runner import ModelRunner
from cudagraph.runner import DecodeCudaGraphRunner, EagerReason
from cudagraph.runner.lifecycle import RunnerAsleepError, RunnerState, RunnerStateError


def engine(kind: Backend = Backend.BREAKABLE, policy: CapturePolicy = CapturePolicy.EAGER):
    model_runner = make_model_runner()
    config = lazy_config((1, 2, 4, 8), policy=policy)
    runner, backend = captured_runner(model_runner, config, backend_kind=kind)
    model_runner.decode_cuda_graph_runner = runner
    return model_runner, runner, backend


def graph_equals_eager(model_runner: ModelRunner, runner: DecodeCudaGraphRunner, size: int, seed: int) -> None:
    batch = decode_batch(model_runner, size, seed=seed)
    eager = model_runner.forward(batch).clone()
    torch.testing.assert_close(model_runner.run(batch), eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", [Backend.FULL, Backend.BREAKABLE])
def test_sleep_gives_back_graphs_and_kv_cache_and_wake_replays_again(kind: Backend) -> None:
    model_runner, runner, backend = engine(kind)
    graph_and_eager = decode_batch(model_runner, 3, seed=1)
    model_runner.run(graph_and_eager)
    entries = [weakref.ref(entry) for entry in backend.entries.values()]
    input_addresses = {name: tensor.data_ptr() for name, tensor in runner.static_buffers.tensors.items()}
    weights = {name: param.data_ptr() for name, param in model_runner.model.named_parameters()}
    pages = model_runner.token_to_kv_pool.kv_pages
    model_runner.sleep()
    gc.collect()
    assert runner.state is RunnerState.ASLEEP and model_runner.asleep
    assert backend.entries == {} and all(entry() is None for entry in entries)  # the graphs are gone
    assert all(bucket.replay is None and bucket.output is None for bucket in runner.static_buckets.values())
    assert runner.graph_inputs.recorded == {} and runner.captured_buckets == ()
    assert all(page.untyped_storage().nbytes() == 0 for page in pages)  # the KV cache is given back
    assert {name: param.data_ptr() for name, param in model_runner.model.named_parameters()} == weights
    with pytest.raises(RunnerAsleepError, match="wake"):
        model_runner.run(graph_and_eager)
    assert runner.route(graph_and_eager).reason is EagerReason.ASLEEP
    model_runner.wake()
    assert runner.state is RunnerState.AWAKE and not model_runner.asleep
    assert runner.captured_buckets == (1, 2, 4, 8) and sorted(backend.shapes) == [1, 2, 4, 8]
    assert all(page.untyped_storage().nbytes() == page.numel() * page.element_size() for page in pages)
    assert {name: tensor.data_ptr() for name, tensor in runner.static_buffers.tensors.items()} == input_addresses
    replayed = len(backend.replayed)
    graph_equals_eager(model_runner, runner, 3, seed=2)
    assert len(backend.replayed) == replayed + 1


def test_under_the_lazy_policy_wake_captures_nothing_until_a_step_needs_it() -> None:
    model_runner, runner, backend = engine(policy=CapturePolicy.LAZY)
    graph_equals_eager(model_runner, runner, 3, seed=1)
    assert backend.captured_order == [4]
    model_runner.sleep()
    model_runner.wake()
    assert backend.entries == {} and runner.static_buckets.pending == {1, 2, 4, 8}
    graph_equals_eager(model_runner, runner, 3, seed=2)
    assert backend.captured_order == [4, 4] and runner.metrics.lazy_captures == 2


def test_lifecycle_calls_out_of_turn_are_one_error_each() -> None:
    runner, _ = lazy_runner(config=lazy_config(policy=CapturePolicy.EAGER))
    with pytest.raises(RunnerStateError, match=r"wake\(\) while awake; allowed now: sleep"):
        runner.wake()
    runner.sleep()
    with pytest.raises(RunnerStateError, match=r"sleep\(\) while asleep; allowed now: wake"):
        runner.sleep()
    with pytest.raises(RunnerAsleepError):
        runner.replay(stub_decode_batch(2))
    assert runner.wake() is RunnerState.AWAKE


def test_a_wake_that_cannot_capture_runs_eagerly_and_says_why() -> None:
    model_runner = StubModelRunner()
    runner, backend = lazy_runner(model_runner, config=lazy_config(policy=CapturePolicy.EAGER))
    runner.sleep()
    capture_one = backend.capture_one
    calls = []

    def failing(shape, forward_fn, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(shape)
        if len(calls) == 2:
            raise RuntimeError("driver said no")
        return capture_one(shape, forward_fn, **kwargs)

    backend.capture_one = failing  # type: ignore[method-assign]
    assert runner.wake() is RunnerState.FAILED
    assert runner.eager_reason is not None and "driver said no" in runner.eager_reason
    assert backend.entries == {} and runner.captured_buckets == ()  # nothing half-captured stays
    batch = stub_decode_batch(3)
    torch.testing.assert_close(runner.replay(batch), model_runner.forward(batch).clone())
    assert runner.metrics.eager_count(EagerReason.EAGER_FALLBACK) == 1
    # Failed is not final: sleep and wake again, the device willing this time.
    backend.capture_one = capture_one  # type: ignore[method-assign]
    runner.sleep()
    assert runner.wake() is RunnerState.AWAKE and runner.eager_reason is None
    replayed = len(backend.replayed)
    torch.testing.assert_close(runner.replay(batch), model_runner.forward(batch).clone())
    assert len(backend.replayed) == replayed + 1
