"""Graphs that outlive a sleep: where a runner's graphs live in memory a sleep unmaps and a wake maps back at the same
addresses, ``sleep(keep_graphs=True)`` keeps them and ``wake()`` captures nothing; where they do not, the sleep frees
them and says why in one line. The engine's sleep levels (0, 1, 2) give back what vLLM's levels give back, with or
without sleepable memory; ``FakeSleepMemory`` stands in for the device's virtual-memory allocator on the CPU and
garbles what it "unmaps", as new physical pages would."""

from __future__ import annotations

import contextlib
import logging
import weakref

import pytest
import torch
from runner_helpers import captured_runner, decode_batch, make_model_runner
from test_runner_lazy_capture import lazy_config

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.backend_utils.sleep_memory import MemoryTag
from cudagraph.config import CapturePolicy
from cudagraph.engine import lifecycle
from cudagraph.engine.lifecycle import SLEEP_LEVELS, WEIGHT_ALIGNMENT
from cudagraph.engine.model_runner import ModelRunner
from cudagraph.runner import DecodeCudaGraphRunner
from cudagraph.runner.lifecycle import RunnerAsleepError, RunnerState

GARBAGE = 12345.0


class FakeSleepMemory:
    """Records ``release``/``restore`` by tag; what a release unmaps comes back as garbage at the same addresses."""

    def __init__(self, model_runner: ModelRunner) -> None:
        self.model_runner = model_runner
        self.released: set[MemoryTag] = set()
        self.calls: list[tuple[str, frozenset[MemoryTag]]] = []

    def tensors_of(self, tag: MemoryTag) -> list[torch.Tensor]:
        if tag is MemoryTag.KV_CACHE:
            return list(self.model_runner.token_to_kv_pool.kv_pages)
        if tag is MemoryTag.WEIGHTS:
            return [parameter.data for parameter in self.model_runner.model.parameters()]
        return []

    def allocating(self, tag: MemoryTag) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def release(self, tags) -> None:  # type: ignore[no-untyped-def]
        tags = frozenset(tags) - self.released
        self.calls.append(("release", tags))
        self.released |= tags

    def restore(self, tags) -> None:  # type: ignore[no-untyped-def]
        tags = frozenset(tags) & self.released
        self.calls.append(("restore", tags))
        for tag in tags:
            for tensor in self.tensors_of(tag):
                tensor.fill_(GARBAGE)
        self.released -= tags


def engine(
    *, outlive: bool, policy: CapturePolicy = CapturePolicy.EAGER
) -> tuple[ModelRunner, DecodeCudaGraphRunner, CpuReplayBackend]:
    model_runner = make_model_runner()
    runner, backend = captured_runner(
        model_runner, lazy_config((1, 2, 4, 8), policy=policy), graphs_outlive_sleep=outlive
    )
    model_runner.decode_cuda_graph_runner = runner
    return model_runner, runner, backend


def graph_equals_eager(model_runner: ModelRunner, size: int, seed: int) -> None:
    batch = decode_batch(model_runner, size, seed=seed)
    eager = model_runner.forward(batch).clone()
    torch.testing.assert_close(model_runner.run(batch), eager, rtol=1e-5, atol=1e-5)


def test_kept_graphs_replay_after_the_wake_with_nothing_captured_again() -> None:
    model_runner, runner, backend = engine(outlive=True)
    graph_equals_eager(model_runner, 3, seed=1)
    entries = {shape: weakref.ref(entry) for shape, entry in backend.entries.items()}
    captured = list(backend.captured_order)
    assert runner.sleep(keep_graphs=True) is True
    assert runner.state is RunnerState.ASLEEP and runner.graphs_kept
    with pytest.raises(RunnerAsleepError, match="wake"):
        runner.replay(decode_batch(model_runner, 2, seed=3))
    assert runner.wake() is RunnerState.AWAKE
    assert backend.captured_order == captured  # nothing captured again
    assert {shape: entry() for shape, entry in entries.items()} == backend.entries  # the same graph objects
    replayed = len(backend.replayed)
    graph_equals_eager(model_runner, 3, seed=2)
    assert len(backend.replayed) == replayed + 1


def test_graphs_in_memory_a_sleep_frees_are_released_and_the_sleep_says_why(caplog) -> None:
    model_runner, runner, backend = engine(outlive=False)
    with caplog.at_level(logging.INFO, logger="cudagraph.runner.lifecycle"):
        assert runner.sleep(keep_graphs=True) is False
    assert backend.entries == {} and not runner.graphs_kept
    assert "captured again at wake: its graphs live in a pool of the caching allocator" in caplog.text
    runner.wake()
    assert backend.captured_order == [8, 4, 2, 1, 8, 4, 2, 1]  # everything captured again
    graph_equals_eager(model_runner, 3, seed=2)


def test_lazily_captured_buckets_stay_captured_and_the_rest_stay_pending() -> None:
    model_runner, runner, backend = engine(outlive=True, policy=CapturePolicy.LAZY)
    graph_equals_eager(model_runner, 3, seed=1)
    assert backend.captured_order == [4] and runner.static_buckets.pending == {1, 2, 8}
    runner.sleep(keep_graphs=True)
    runner.wake()
    graph_equals_eager(model_runner, 4, seed=2)  # bucket 4 again: replayed, not captured
    graph_equals_eager(model_runner, 2, seed=3)  # bucket 2: its first use captures it now
    assert backend.captured_order == [4, 2] and runner.metrics.lazy_captures == 2


@pytest.mark.parametrize("level", sorted(SLEEP_LEVELS))
def test_engine_levels_release_their_tags_and_bring_the_weights_back(level: int) -> None:
    model_runner, runner, backend = engine(outlive=True)
    memory = FakeSleepMemory(model_runner)
    model_runner.sleep_memory = memory  # type: ignore[assignment]
    weights = {name: value.clone() for name, value in model_runner.model.state_dict().items()}
    captured = list(backend.captured_order)
    model_runner.sleep(level)
    expected = {MemoryTag.GRAPHS, MemoryTag.KV_CACHE} | ({MemoryTag.WEIGHTS} if level else set())
    assert memory.calls == [("release", frozenset(expected))]
    with pytest.raises(RunnerAsleepError):
        model_runner.run(decode_batch(model_runner, 2, seed=4))
    model_runner.wake()
    restored = [tags for call, tags in memory.calls[1:] if call == "restore"]
    assert frozenset().union(*restored) == expected and sum(map(len, restored)) == len(expected)
    if level == 1:  # the weights first, so their copy runs while the rest comes back
        assert restored[0] == {MemoryTag.WEIGHTS}
    assert all(int(pages.count_nonzero()) == 0 for pages in model_runner.token_to_kv_pool.kv_pages)  # KV empty
    if level == 2:  # discarded: the caller loads the weights, in place, as an RL driver does
        assert any(bool((value == GARBAGE).all()) for value in model_runner.model.state_dict().values())
        update = model_runner.update_weights(weights)
        assert update.recaptured == {"decode": ()}
    assert all(torch.equal(model_runner.model.state_dict()[name], value) for name, value in weights.items())
    assert backend.captured_order == captured and runner.state is RunnerState.AWAKE
    graph_equals_eager(model_runner, 3, seed=5)


@pytest.mark.parametrize("level", [1, 2])
def test_without_sleepable_memory_the_weights_storage_goes_and_comes_back(level: int) -> None:
    model_runner, _, backend = engine(outlive=False)
    weights = {name: value.clone() for name, value in model_runner.model.state_dict().items()}
    model_runner.sleep(level)
    assert all(parameter.untyped_storage().nbytes() == 0 for parameter in model_runner.model.parameters())
    assert backend.entries == {}
    model_runner.wake()
    if level == 2:
        model_runner.update_weights(weights)
    assert all(torch.equal(model_runner.model.state_dict()[name], value) for name, value in weights.items())
    graph_equals_eager(model_runner, 3, seed=6)


def test_a_level_2_wake_that_captures_again_on_garbage_weights_leaves_the_kv_cache_zero(monkeypatch) -> None:
    model_runner, _, _ = engine(outlive=False)
    resize = lifecycle._resize_storages

    def resize_to_garbage(tensors, *, to_nothing: bool) -> None:  # fresh storage as a device may hand it: NaN
        resize(tensors, to_nothing=to_nothing)
        if not to_nothing:
            for tensor in tensors:
                tensor.data.fill_(float("nan"))

    monkeypatch.setattr(lifecycle, "_resize_storages", resize_to_garbage)
    model_runner.sleep(2)
    model_runner.wake()  # the decode graphs are captured again, on NaN weights and a NaN cache
    assert model_runner.decode_cuda_graph_runner.captured_buckets == (1, 2, 4, 8)
    assert all(bool((page == 0).all()) for page in model_runner.token_to_kv_pool.kv_pages)


def test_a_sleep_level_outside_the_table_is_one_error_naming_the_levels() -> None:
    model_runner = make_model_runner()
    with pytest.raises(ValueError, match=r"sleep level 3: allowed: 0 \(the weights stay on the device\); 1 "):
        model_runner.sleep(3)
    assert not model_runner.asleep


def test_sleep_mode_without_cuda_says_why_and_the_engine_recaptures(caplog) -> None:
    model = make_model_runner().model
    with caplog.at_level(logging.INFO, logger="cudagraph.engine.lifecycle"):
        model_runner = ModelRunner(model, make_model_runner().cuda_graph_config, enable_sleep_mode=True)
    assert model_runner.sleep_memory is None
    assert model_runner.sleep_memory_reason is not None and "needs a CUDA device" in model_runner.sleep_memory_reason
    assert "graphs will be captured again at every wake: memory that outlives a sleep needs a CUDA device" in (
        caplog.text
    )


def test_sleep_mode_puts_every_parameter_in_one_aligned_buffer_that_level_1_copies_whole(monkeypatch) -> None:
    built = make_model_runner()
    model = built.model
    fake: list[FakeSleepMemory] = []

    def open_fake(device: torch.device) -> tuple[FakeSleepMemory, None]:
        fake.append(FakeSleepMemory(built))  # its model runner is swapped for the new one below
        return fake[0], None

    monkeypatch.setattr(lifecycle, "open_sleep_memory", open_fake)
    batch_seed = 7
    expected = built.forward(decode_batch(built, 3, seed=batch_seed)).clone()
    model_runner = ModelRunner(model, built.cuda_graph_config, cache_config=built.cache_config, enable_sleep_mode=True)
    fake[0].model_runner = model_runner
    buffer = model_runner.weights_buffer
    assert buffer is not None and buffer.dtype is torch.uint8
    parameters = list({id(p): p for p in model.parameters()}.values())
    start = buffer.data_ptr()
    assert all(p.untyped_storage().data_ptr() == start for p in parameters)  # every one a view of the buffer
    assert all((p.data_ptr() - start) % WEIGHT_ALIGNMENT == 0 for p in parameters)
    assert buffer.numel() >= sum(p.numel() * p.element_size() for p in parameters)
    torch.testing.assert_close(model_runner.forward(decode_batch(model_runner, 3, seed=batch_seed)), expected)
    values = {name: value.clone() for name, value in model.state_dict().items()}
    model_runner.sleep(1)
    assert [host.shape for host in model_runner.weights_on_host] == [buffer.shape]  # one block, out and back
    model_runner.wake()  # the fake garbles what it maps back; the wake copies the block back over it
    assert all(torch.equal(model.state_dict()[name], value) for name, value in values.items())
