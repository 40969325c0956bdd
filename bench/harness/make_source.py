"""``make_source``: the step source of one configuration row (the table in ``configs`` -> the classes in
``sources``), or the reason the row cannot run here."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from cudagraph.config import ConfigError
from cudagraph.engine.model_runner import ModelRunner

from .configs import BenchConfig, Kind
from .peers import PEERS_BY_NAME, Peer, PeerUnavailableError
from .sources import (
    EagerSource,
    PeerSource,
    PrimitiveSource,
    RawGraphSource,
    RunnerSource,
    SourceUnavailableError,
    StepSource,
    TorchCompileSource,
)

Shapes = Mapping[str, tuple[int, ...]]


def _peer_source(config: BenchConfig, model_runner: ModelRunner, shapes: Shapes) -> StepSource:
    assert config.peer is not None, f"peer row {config.name} names no peer"
    try:
        return PeerSource(model_runner, Peer.load(PEERS_BY_NAME[config.peer]))
    except PeerUnavailableError as error:
        raise SourceUnavailableError(str(error)) from None


def _runner_source(config: BenchConfig, model_runner: ModelRunner, shapes: Shapes) -> StepSource:
    try:
        runner_config = config.runner_config(shapes)
    except ConfigError as error:
        raise SourceUnavailableError(f"the config rejects it: {error}") from None
    return RunnerSource(model_runner, runner_config, prefill="prefill" in shapes)


SOURCE_FACTORIES: dict[Kind, Callable[[BenchConfig, ModelRunner, Shapes], StepSource]] = {
    Kind.EAGER: lambda config, model_runner, shapes: EagerSource(model_runner),
    Kind.RAW: lambda config, model_runner, shapes: RawGraphSource(model_runner),
    Kind.PRIMITIVE: lambda config, model_runner, shapes: PrimitiveSource(model_runner),
    Kind.TORCH_COMPILE: lambda config, model_runner, shapes: TorchCompileSource(model_runner),
    Kind.PEER: _peer_source,
    Kind.RUNNER: _runner_source,
}
"""Configuration kind -> how its source is made."""


def make_source(config: BenchConfig, model_runner: ModelRunner, shapes: Shapes) -> StepSource:
    """The source of ``config`` for ``shapes`` (``decode``/``prefill`` -> the shapes to capture); raises
    ``SourceUnavailableError`` with the reason when the config rejects the row or a peer is not installed."""
    return SOURCE_FACTORIES[config.kind](config, model_runner, shapes)
