"""The PyPI peers ``breakable-cuda-graphs`` and ``piecewise-cuda-graphs`` behind one small interface, applied to the
engine's forward with the same break points as our backends: every call of a registered split op (the attention op)
is routed through the peer's ``no_graph`` by a dispatch mode that is active only while capturing, so the model
itself is not edited and replay is the peer's own loop.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cudagraph.backend_utils import is_split_op

INSTALL_HINT = "python3 -m pip install --no-index --no-deps --target .site .whl/*.whl (the wheels travel in .whl/)"


@dataclass(frozen=True)
class PeerApi:
    """Where a peer keeps its replayable object, its capture context manager and its break decorator."""

    distribution: str
    module: str
    graph_class: str
    capture_context: str
    no_graph: str = "no_graph"


PEERS: tuple[PeerApi, ...] = (
    PeerApi("breakable-cuda-graphs", "breakable_cuda_graphs", "BreakableCUDAGraph", "breakable_graph"),
    PeerApi("piecewise-cuda-graphs", "piecewise_cuda_graphs", "CUDAGraphSequence", "piecewise_graph"),
)
"""Every peer, in table order."""

PEERS_BY_NAME = {peer.distribution: peer for peer in PEERS}


class PeerUnavailableError(RuntimeError):
    """The peer's module is not importable; the message says how to install it."""


@dataclass(frozen=True)
class Peer:
    """A loaded peer: make a graph, capture into it, wrap a function as a break."""

    api: PeerApi
    module: ModuleType

    @classmethod
    def load(cls, api: PeerApi) -> Peer:
        """Import the peer, or raise ``PeerUnavailableError`` naming the install command."""
        try:
            module = importlib.import_module(api.module)
        except ModuleNotFoundError as error:
            raise PeerUnavailableError(f"{api.distribution} is not installed ({error}): {INSTALL_HINT}") from None
        return cls(api, module)

    def new_graph(self) -> Any:
        """An empty replayable object (``.replay()``, ``.reset()``)."""
        return getattr(self.module, self.api.graph_class)()

    def no_graph(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` as the peer's eager break."""
        return getattr(self.module, self.api.no_graph)(fn)  # type: ignore[no-any-return]

    @contextlib.contextmanager
    def capture(self, graph: Any) -> Iterator[None]:
        """Capture the block into ``graph``, breaking at every registered split op."""
        with _SplitOpsThrough(self), getattr(self.module, self.api.capture_context)(graph):
            yield


class _SplitOpsThrough(TorchDispatchMode):
    """Routes every call of a registered split op through the peer's ``no_graph`` (wrapped once per op)."""

    def __init__(self, peer: Peer) -> None:
        super().__init__()
        self.peer = peer
        self.wrapped: dict[torch._ops.OpOverload, Callable[..., Any]] = {}

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # As our breakable capture's mode does: no dynamo import on the first op, no wrapper frame on every op.
        return False

    def __torch_dispatch__(
        self, func: torch._ops.OpOverload, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if not is_split_op(func):
            return func(*args, **kwargs)
        wrapped = self.wrapped.get(func)
        if wrapped is None:
            wrapped = self.wrapped[func] = self.peer.no_graph(func)
        return wrapped(*args, **kwargs)
