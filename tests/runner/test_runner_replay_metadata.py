"""The replay hook's one argument, ``ReplayMetadata``, and the legacy positional hook a runner still calls: which
one a backend implements is read from its signature once, when the runner is built, and both replay what eager
computes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from runner_helpers import admit, make_model_runner, prefill_eagerly, prompts_of

import cudagraph.runner.replay_metadata as replay_metadata_module
from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.config import Backend
from cudagraph.engine.batch import make_decode_batch, make_extend_batch
from cudagraph.engine.model_runner import ModelRunner
from cudagraph.runner import (
    DecodeCudaGraphRunner,
    ForwardBatch,
    ForwardMode,
    PrefillCudaGraphRunner,
    ReplayMetadata,
    bind_replay_hook,
)
from cudagraph.runner.replay_metadata import takes_replay_metadata


def metadata_hook(self: object, metadata: ReplayMetadata) -> None: ...


def metadata_hook_with_options(
    self: object, metadata: ReplayMetadata, *, trace: bool = False, **kwargs: Any
) -> None: ...


def pass_through_hook(self: object, *args: Any, **kwargs: Any) -> None: ...


class Heard:
    """What a hook was called with: ``metadata`` calls (one ``ReplayMetadata``) or ``legacy`` calls (args, kwargs)."""

    def __init__(self) -> None:
        self.metadata: list[ReplayMetadata] = []
        self.legacy: list[tuple[tuple[Any, ...], dict[str, Any]]] = []


class LegacyHook:
    """A replay hook written against the legacy positional signature (as SGLang-style attention backends are): it
    hears the seven arguments and plans what ``plan`` (the engine's own hook, if given) plans."""

    def __init__(self, plan: Callable[[ReplayMetadata], None] | None = None) -> None:
        self.plan = plan
        self.heard = Heard()

    def __call__(
        self,
        batch_size: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_sum: int,
        forward_mode: ForwardMode,
        seq_lens_cpu: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> None:
        self.heard.legacy.append(
            (
                (batch_size, req_pool_indices, seq_lens, seq_lens_sum, forward_mode),
                {"seq_lens_cpu": seq_lens_cpu, **kwargs},
            )
        )
        if self.plan is not None:
            forward_batch = kwargs.get("forward_batch")
            in_graph = bool(kwargs.get("attention_in_graph", False))
            metadata = ReplayMetadata(
                batch_size,
                req_pool_indices,
                seq_lens,
                seq_lens_sum,
                forward_mode,
                seq_lens_cpu,
                forward_batch,
                in_graph,
            )
            self.plan(metadata)


@pytest.mark.parametrize(
    ("hook", "takes_metadata"),
    [
        (metadata_hook, True),
        (metadata_hook_with_options, True),
        (LegacyHook(), False),
        (pass_through_hook, False),
    ],
    ids=["metadata", "metadata-and-options", "legacy-positional", "args-kwargs"],
)
def test_the_hook_kind_is_read_from_its_signature(hook: Any, takes_metadata: bool) -> None:
    backend = type("Backend", (), {"init_forward_metadata_replay_cuda_graph": hook})()
    assert takes_replay_metadata(backend.init_forward_metadata_replay_cuda_graph) is takes_metadata
    bound = bind_replay_hook(backend)
    assert (bound == backend.init_forward_metadata_replay_cuda_graph) is takes_metadata


def test_a_hook_whose_signature_cannot_be_read_is_called_the_legacy_way() -> None:
    assert not takes_replay_metadata(print)


def test_replay_metadata_is_frozen_and_slotted() -> None:
    rows = torch.zeros(2, dtype=torch.int32)
    metadata = ReplayMetadata(2, rows, rows + 1, 2, ForwardMode.DECODE)
    assert not hasattr(metadata, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        metadata.batch_size = 4  # type: ignore[misc]
    assert (metadata.seq_lens_cpu, metadata.forward_batch, metadata.attention_in_graph) == (None, None, False)


def listen_with_metadata(model_runner: ModelRunner) -> Heard:
    """Record the engine backend's own hook (the ``ReplayMetadata`` kind) as it runs."""
    attn_backend = model_runner.attn_backend
    hook = attn_backend.init_forward_metadata_replay_cuda_graph
    heard = Heard()

    def on_replay(metadata: ReplayMetadata) -> None:
        heard.metadata.append(metadata)
        hook(metadata)

    attn_backend.init_forward_metadata_replay_cuda_graph = on_replay  # type: ignore[method-assign]
    return heard


def make_legacy(model_runner: ModelRunner) -> Heard:
    """Turn the engine's attention backend into a third-party one written against the legacy positional hook."""
    attn_backend = model_runner.attn_backend
    legacy = LegacyHook(attn_backend.init_forward_metadata_replay_cuda_graph)
    attn_backend.init_forward_metadata_replay_cuda_graph = legacy  # type: ignore[method-assign]
    return legacy.heard


HOOK_KINDS = {"metadata": listen_with_metadata, "legacy": make_legacy}


def decode_batch(model_runner: ModelRunner, batch_size: int) -> ForwardBatch:
    requests = admit(model_runner, prompts_of([3 + index % 4 for index in range(batch_size)]))
    prefill_eagerly(model_runner, requests)
    return make_decode_batch(requests, model_runner.device)


@pytest.mark.parametrize("kind", HOOK_KINDS)
@pytest.mark.parametrize("backend_kind", [Backend.FULL, Backend.BREAKABLE])
def test_decode_calls_either_kind_of_hook_and_replays_what_eager_computes(kind: str, backend_kind: Backend) -> None:
    model_runner = make_model_runner()
    heard = HOOK_KINDS[kind](model_runner)
    runner = DecodeCudaGraphRunner(
        model_runner, model_runner.cuda_graph_config, backend=CpuReplayBackend(backend_kind), show_progress=False
    )
    runner.capture()
    batch = decode_batch(model_runner, 3)
    eager = model_runner.forward(batch).clone()
    replayed = runner.replay(batch)
    torch.testing.assert_close(replayed, eager, rtol=1e-5, atol=1e-5)
    static = runner.static_buckets[4].batch
    fill = runner.static_buffers.seq_len_fill_value
    padded_sum = batch.seq_lens_sum + fill  # one padded row at the fill value
    if kind == "metadata":
        (metadata,) = heard.metadata
        assert (metadata.batch_size, metadata.seq_lens_sum, metadata.forward_mode) == (
            4,
            padded_sum,
            ForwardMode.DECODE,
        )
        assert metadata.req_pool_indices is static.req_pool_indices and metadata.seq_lens is static.seq_lens
        assert metadata.forward_batch is None and metadata.attention_in_graph is False
    else:
        ((args, kwargs),) = heard.legacy
        assert args[0] == 4 and args[1] is static.req_pool_indices and args[2] is static.seq_lens
        assert args[3:] == (padded_sum, ForwardMode.DECODE)
        assert list(kwargs) == ["seq_lens_cpu"], "decode passes what it always passed: seq_lens_cpu= alone"


@pytest.mark.parametrize("kind", HOOK_KINDS)
@pytest.mark.parametrize(("backend_kind", "in_graph"), [(Backend.FULL, True), (Backend.BREAKABLE, False)])
def test_prefill_calls_either_kind_of_hook_with_the_static_batch(
    kind: str, backend_kind: Backend, in_graph: bool
) -> None:
    model_runner = make_model_runner()
    heard = HOOK_KINDS[kind](model_runner)
    runner = PrefillCudaGraphRunner(
        model_runner, model_runner.cuda_graph_config, backend=CpuReplayBackend(backend_kind), show_progress=False
    )
    runner.capture()
    batch = make_extend_batch(admit(model_runner, prompts_of([5, 9])), model_runner.device)
    if not in_graph:  # torch's extend attention runs as a break: the replay computes what eager does
        eager = model_runner.forward(batch).clone()
        torch.testing.assert_close(runner.replay(batch), eager, rtol=1e-5, atol=1e-5)
    else:
        runner.replay(batch)
    static = runner.static_buckets[16].batch
    if kind == "metadata":
        (metadata,) = heard.metadata
        assert metadata.forward_batch is static and metadata.attention_in_graph is in_graph
        assert (metadata.batch_size, metadata.forward_mode) == (runner.requests_per_graph(16), ForwardMode.EXTEND)
    else:
        ((args, kwargs),) = heard.legacy
        assert args[0] == runner.requests_per_graph(16) and args[4] is ForwardMode.EXTEND
        assert kwargs["forward_batch"] is static and kwargs["attention_in_graph"] is in_graph


def test_the_hook_is_inspected_once_when_the_runner_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kind is decided at construction: replays call what was bound then, with no inspection per step."""
    inspected: list[object] = []
    real = replay_metadata_module.takes_replay_metadata

    def counting(hook: Any) -> bool:
        inspected.append(hook)
        return real(hook)

    monkeypatch.setattr(replay_metadata_module, "takes_replay_metadata", counting)
    model_runner = make_model_runner()
    heard = make_legacy(model_runner)
    runner = DecodeCudaGraphRunner(
        model_runner, model_runner.cuda_graph_config, backend=CpuReplayBackend(), show_progress=False
    )
    assert len(inspected) == 1
    runner.capture()
    for batch_size in (1, 3, 5):
        runner.replay(decode_batch(model_runner, batch_size))
    assert len(inspected) == 1 and len(heard.legacy) == 3


def test_the_metadata_of_a_batch_names_its_own_rows_and_an_extend_batch_itself() -> None:
    model_runner = make_model_runner()
    decode = decode_batch(model_runner, 3)
    metadata = ReplayMetadata.of_batch(decode)
    assert (metadata.batch_size, metadata.seq_lens_sum, metadata.forward_mode) == (
        3,
        decode.seq_lens_sum,
        decode.forward_mode,
    )
    assert metadata.seq_lens is decode.seq_lens and metadata.req_pool_indices is decode.req_pool_indices
    assert metadata.forward_batch is None and metadata.attention_in_graph is False
    requests = admit(model_runner, prompts_of([4, 2]))
    extend = make_extend_batch(requests, model_runner.device)
    metadata = ReplayMetadata.of_batch(extend, attention_in_graph=True)
    assert metadata.forward_batch is extend and metadata.attention_in_graph and metadata.batch_size == 2
