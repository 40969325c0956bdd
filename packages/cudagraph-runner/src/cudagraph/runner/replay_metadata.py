"""What the attention backend's replay hook is told before a graph replays: one ``ReplayMetadata``, built per step.

A runner calls ``attn_backend.init_forward_metadata_replay_cuda_graph`` once per replayed step, outside the graph,
so the backend can refresh the static metadata the captured kernels read. The hook takes one argument::

    def init_forward_metadata_replay_cuda_graph(self, metadata: ReplayMetadata) -> None: ...

Preferred: this form. Backends written against the legacy positional hook, the SGLang-style
``(batch_size, req_pool_indices, seq_lens, seq_lens_sum, forward_mode, seq_lens_cpu=None, **kwargs)``, keep working:
``bind_replay_hook`` reads the hook's signature once, when a runner is built, and returns a callable that takes a
``ReplayMetadata`` either way (for a legacy hook, an adapter that spells the old call out of it; one Python call more
per step). Nothing is inspected per step.

The runner builds one ``ReplayMetadata`` per replay (a frozen dataclass with slots: a few hundred nanoseconds, no
dict); a hook must not keep it past the call, since the tensors it names are the runner's static buffers, refilled
by the next step.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .forward_batch import ForwardBatch, ForwardMode

__all__ = ["ReplayHook", "ReplayMetadata", "bind_replay_hook", "takes_replay_metadata"]


@dataclass(frozen=True, slots=True)
class ReplayMetadata:
    """One replayed step, as the attention backend's replay hook sees it: the captured shape and the static
    tensors that now hold the step.

    Example:
        >>> import torch
        >>> from cudagraph.runner import ForwardMode, ReplayMetadata
        >>> rows = torch.zeros(4, dtype=torch.int32)
        >>> metadata = ReplayMetadata(4, rows, rows + 1, 4, ForwardMode.DECODE)
        >>> metadata.batch_size, metadata.seq_lens_cpu, metadata.attention_in_graph
        (4, None, False)
    """

    batch_size: int
    """Request rows of the graph about to replay: the decode bucket (padded rows included), or a prefill bucket's
    request rows. The backend's static state of that shape is the one to refresh."""
    req_pool_indices: torch.Tensor
    """``[batch_size]`` request-to-token rows of the step, on the device: the runner's static buffer (padded rows
    hold ``PADDING_REQ_POOL_INDEX``)."""
    seq_lens: torch.Tensor
    """``[batch_size]`` context lengths of the step, on the device: the runner's static buffer (padded rows hold
    ``get_cuda_graph_seq_len_fill_value()``)."""
    seq_lens_sum: int
    """The sum of ``seq_lens`` over every row the graph holds (decode: padded rows at their fill value included;
    prefill: the real requests')."""
    forward_mode: ForwardMode
    """The mode the graph was captured for: ``DECODE`` (an idle step replays a decode graph too), ``TARGET_VERIFY``
    or ``EXTEND``."""
    seq_lens_cpu: torch.Tensor | None = None
    """``seq_lens`` on the host, when the runner keeps a host copy current (a backend that plans on the host
    reads it; decode skips it for a backend whose ``needs_seq_lens_cpu`` is ``False``). ``None``: read
    ``seq_lens``."""
    forward_batch: ForwardBatch | None = None
    """Prefill: the bucket's static batch, whose host-side fields (``batch_size``, ``extend_seq_lens_cpu``, ...)
    describe the real requests of this step; ``None`` for decode."""
    attention_in_graph: bool = False
    """Prefill: whether attention was captured inside the graph (``full``, which replays the backend's per-bucket
    state) or runs as an eager break (``breakable``, ``tc_piecewise``); always ``False`` for decode."""
    query_len: int = 1
    """Tokens each request brings to a uniform step: 1 in decode, ``k + 1`` in a verify step (the graph holds
    ``batch_size * query_len`` token rows)."""

    @classmethod
    def of_batch(cls, batch: ForwardBatch, *, attention_in_graph: bool = False) -> ReplayMetadata:
        """The metadata of ``batch`` taken as it is (no padded rows added): its own size, tensors and lengths; an
        extend batch is also the ``forward_batch``, a verify batch's tokens per request its ``query_len``. For code
        that drives a backend's hook itself (benchmarks, tests); runners build theirs from the bucket's static
        batch."""
        uniform_tokens = batch.forward_mode.is_verify() and batch.batch_size > 0
        return cls(
            batch.batch_size,
            batch.req_pool_indices,
            batch.seq_lens,
            batch.seq_lens_sum,
            batch.forward_mode,
            batch.seq_lens_cpu,
            batch if batch.forward_mode.is_extend() else None,
            attention_in_graph,
            batch.num_tokens // batch.batch_size if uniform_tokens else 1,
        )


ReplayHook = Callable[[ReplayMetadata], None]
"""What a runner calls before each replay: the backend's hook, or the adapter of a legacy one."""


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def takes_replay_metadata(hook: Callable[..., object]) -> bool:
    """Whether ``hook`` (a bound replay hook) takes one ``ReplayMetadata`` rather than the legacy positional
    arguments: it has exactly one required positional parameter and no ``*args``.

    A hook declared ``(*args, **kwargs)`` (a pass-through or a stub) counts as legacy: that is the call every
    SGLang-style backend accepts. A hook whose signature cannot be read (a builtin) is legacy too.
    """
    try:
        parameters = inspect.signature(hook).parameters.values()
    except (TypeError, ValueError):
        return False
    if any(parameter.kind is inspect.Parameter.VAR_POSITIONAL for parameter in parameters):
        return False
    required = [
        parameter
        for parameter in parameters
        if parameter.kind in _POSITIONAL and parameter.default is inspect.Parameter.empty
    ]
    return len(required) == 1


def bind_replay_hook(attn_backend: object) -> ReplayHook:
    """``attn_backend.init_forward_metadata_replay_cuda_graph`` as a callable taking one ``ReplayMetadata``,
    decided once from its signature (``takes_replay_metadata``): the hook itself, or for a legacy positional hook
    an adapter that calls it as runners used to::

        hook(batch_size, req_pool_indices, seq_lens, seq_lens_sum, forward_mode, seq_lens_cpu=...)

    with, for prefill (``forward_batch`` set), ``forward_batch=`` and ``attention_in_graph=`` as keywords too.
    """
    hook = attn_backend.init_forward_metadata_replay_cuda_graph  # type: ignore[attr-defined]
    if takes_replay_metadata(hook):
        return hook  # type: ignore[no-any-return]
    return _legacy_adapter(hook)


def _legacy_adapter(hook: Callable[..., object]) -> ReplayHook:
    def replay_legacy_hook(metadata: ReplayMetadata) -> None:
        prefill: dict[str, object] = (
            {}
            if metadata.forward_batch is None
            else {"forward_batch": metadata.forward_batch, "attention_in_graph": metadata.attention_in_graph}
        )
        hook(
            metadata.batch_size,
            metadata.req_pool_indices,
            metadata.seq_lens,
            metadata.seq_lens_sum,
            metadata.forward_mode,
            seq_lens_cpu=metadata.seq_lens_cpu,
            **prefill,
        )

    return replay_legacy_hook
