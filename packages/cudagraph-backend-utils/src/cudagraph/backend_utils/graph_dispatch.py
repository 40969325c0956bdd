"""Which graph a forward is being captured for: a hashable shape descriptor, and the dispatch that carries it.

Code inside a model forward (a compiled piece's wrapper, an op) must not take the graph's shape as an argument, so a
backend sets a ``GraphDispatch`` around what it captures and that code reads it with ``get_graph_dispatch()``, as
vLLM's CUDA-graph wrappers read the ``BatchDescriptor`` of their forward context. Outside a capture there is none and
everything runs eagerly. Nothing here touches CUDA.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["GraphDispatch", "GraphMode", "ShapeDescriptor", "get_graph_dispatch", "graph_dispatch"]


@dataclass(frozen=True)
class ShapeDescriptor:
    """The shape one graph serves: ``tokens`` in the forward, the ``requests`` they belong to, and the query length
    every request shares (1 for decode; ``None`` for a prefill or a mixed batch, whose requests differ).

    Hashable and frozen, so it keys per-shape state.

    Example:
        >>> ShapeDescriptor.decode(8)
        ShapeDescriptor(tokens=8, requests=8, uniform_query_len=1)
        >>> ShapeDescriptor.decode(8) == ShapeDescriptor(tokens=8, requests=8, uniform_query_len=1)
        True
    """

    tokens: int
    requests: int | None = None
    uniform_query_len: int | None = None

    def __post_init__(self) -> None:
        if self.tokens < 0 or (self.requests is not None and self.requests < 0):
            raise ValueError(f"a shape has no negative sizes; got tokens={self.tokens}, requests={self.requests}")

    @classmethod
    def decode(cls, batch_size: int) -> ShapeDescriptor:
        """A decode step of ``batch_size`` requests, one token each."""
        return cls(tokens=batch_size, requests=batch_size, uniform_query_len=1)

    @classmethod
    def uniform(cls, requests: int, query_len: int) -> ShapeDescriptor:
        """A step of ``requests`` requests of ``query_len`` tokens each: decode (1) or a speculative verify (the
        last token and ``query_len - 1`` draft tokens).

        Example:
            >>> ShapeDescriptor.uniform(8, 4)
            ShapeDescriptor(tokens=32, requests=8, uniform_query_len=4)
        """
        if query_len < 1:
            raise ValueError(f"a uniform step has at least one token per request; got query_len={query_len}")
        return cls(tokens=requests * query_len, requests=requests, uniform_query_len=query_len)

    @property
    def is_uniform(self) -> bool:
        """Whether every request has the same query length (a full graph keyed by request count serves it)."""
        return self.uniform_query_len is not None

    @classmethod
    def prefill(cls, tokens: int) -> ShapeDescriptor:
        """A prefill (extend) step of ``tokens`` tokens over any number of requests."""
        return cls(tokens=tokens)

    def __str__(self) -> str:
        parts = [f"tokens={self.tokens}"]
        if self.requests is not None:
            parts.append(f"requests={self.requests}")
        if self.uniform_query_len is not None:
            parts.append(f"query_len={self.uniform_query_len}")
        return " ".join(parts)


class GraphMode(str, enum.Enum):
    """What a forward run under a ``GraphDispatch`` is for."""

    CAPTURE = "capture"
    """Recorded into the graphs of ``GraphDispatch.shape``."""
    EAGER = "eager"
    """Run eagerly (a warm-up, or a shape with no graph), with the shape known."""


@dataclass(frozen=True)
class GraphDispatch:
    """The mode and shape of the forward being run (see the module docstring)."""

    mode: GraphMode
    shape: ShapeDescriptor


_GRAPH_DISPATCH: ContextVar[GraphDispatch | None] = ContextVar("cudagraph_graph_dispatch", default=None)


@contextlib.contextmanager
def graph_dispatch(dispatch: GraphDispatch | None) -> Iterator[GraphDispatch | None]:
    """Make ``dispatch`` the one ``get_graph_dispatch()`` returns until the block ends (the outer one is restored).

    Example:
        >>> with graph_dispatch(GraphDispatch(GraphMode.CAPTURE, ShapeDescriptor.decode(4))):
        ...     get_graph_dispatch().mode.value
        'capture'
        >>> get_graph_dispatch() is None
        True
    """
    token = _GRAPH_DISPATCH.set(dispatch)
    try:
        yield dispatch
    finally:
        _GRAPH_DISPATCH.reset(token)


def get_graph_dispatch() -> GraphDispatch | None:
    """The dispatch of the forward being run in this thread, or ``None`` (plain eager run)."""
    return _GRAPH_DISPATCH.get()
