"""Static input buffers a graph reads: sized for the largest bucket, padded rows kept harmless.

A padded row points at the scratch request row and the scratch KV slot and carries the attention backend's fill
``seq_len``, so it never reads or writes a live request's cache. Copies go through one ``torch._foreach_copy_``
per dtype (on CUDA, one fused kernel for all int64 fields and one for the int32 ones). Everything a copy of a given
size needs besides the batch (the target views, the readers of the batch's fields, the host mirror's view) is built
once per size and cached, so a step builds no lists and looks up no names.

A caller that writes its batch straight into the buffers (``StaticBuffers.views``: the first rows of each, the same
tensor objects every time) makes no copy at all: a group whose fields are those views is skipped, so such a step
launches nothing before the graph.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from .forward_batch import PADDING_KV_SLOT, PADDING_REQ_POOL_INDEX, ForwardBatch


@dataclass(frozen=True)
class PaddedField:
    """One static buffer: the ``ForwardBatch`` field it mirrors, its dtype, whether it is per token or per request,
    and the value its padded rows hold (``None``: the attention backend's ``seq_len`` fill value)."""

    name: str
    dtype: torch.dtype
    per_token: bool
    padding: int | None


DECODE_FIELDS = (
    PaddedField("input_ids", torch.int64, per_token=True, padding=0),
    PaddedField("positions", torch.int64, per_token=True, padding=0),
    PaddedField("out_cache_loc", torch.int64, per_token=True, padding=PADDING_KV_SLOT),
    PaddedField("seq_lens", torch.int32, per_token=False, padding=None),
    PaddedField("req_pool_indices", torch.int64, per_token=False, padding=PADDING_REQ_POOL_INDEX),
)
"""Decode: one token per request, so every field has one row per request."""

EXTEND_FIELDS = (
    *DECODE_FIELDS,
    PaddedField("extend_seq_lens", torch.int32, per_token=False, padding=0),
    PaddedField("extend_prefix_lens", torch.int32, per_token=False, padding=0),
    PaddedField("extend_start_loc", torch.int32, per_token=False, padding=0),
)
"""Extend: padded requests own no tokens (length 0 starting at 0); padded tokens write to the scratch slot."""


@dataclass(frozen=True)
class _LoadPlan:
    """How a batch of one size is copied in: one bound copy per dtype group, the view of the host ``seq_lens``
    mirror its lengths go to, and every target view by field name (what ``StaticBuffers.views`` hands out)."""

    copies: tuple[Callable[[ForwardBatch], object], ...]
    host_seq_lens: torch.Tensor
    views: Mapping[str, torch.Tensor]
    """Read-only; ``host_seq_lens`` is in it as ``"seq_lens_cpu"``."""


def _group_copy(targets: tuple[torch.Tensor, ...], names: tuple[str, ...]) -> Callable[[ForwardBatch], object]:
    """Copy the batch's fields ``names`` into ``targets`` (same order): one fused ``_foreach_copy_`` for several,
    a plain ``copy_`` for one (the multi-tensor path costs more host time than it saves on a single tensor). Fields
    that are the targets themselves (written in place) are not copied."""
    if len(names) == 1:
        (target,), read_one = targets, operator.attrgetter(names[0])
        copy_one = target.copy_

        def copy_field(batch: ForwardBatch) -> None:
            source = read_one(batch)
            if source is not target:
                copy_one(source)

        return copy_field
    read_all, foreach_copy, same = operator.attrgetter(*names), torch._foreach_copy_, operator.is_
    target_list = list(targets)

    def copy_fields(batch: ForwardBatch) -> None:
        sources = read_all(batch)
        if not all(map(same, sources, targets)):
            foreach_copy(target_list, sources)

    return copy_fields


@dataclass
class StaticBuffers:
    """The static buffers of one runner, one tensor per ``PaddedField``, plus a CPU mirror of ``seq_lens``."""

    fields: tuple[PaddedField, ...]
    dtype_groups: tuple[tuple[PaddedField, ...], ...]
    """``fields`` grouped by dtype, each group copied with one ``_foreach_copy_``."""
    tensors: dict[str, torch.Tensor]
    seq_lens_cpu: torch.Tensor
    seq_len_fill_value: int
    mirror_seq_lens_cpu: bool = True
    """Keep ``seq_lens_cpu`` current (only attention backends that plan on the host need it)."""
    _load_plans: dict[tuple[int, int], _LoadPlan] = field(default_factory=dict, repr=False)
    _dirty_tokens: int = 0
    _dirty_requests: int = 0

    @classmethod
    def allocate(
        cls,
        padded_fields: tuple[PaddedField, ...],
        max_tokens: int,
        max_requests: int,
        device: torch.device,
        seq_len_fill_value: int,
    ) -> StaticBuffers:
        """Buffers for ``max_tokens`` tokens and ``max_requests`` requests, every row holding its padding."""
        dtypes = dict.fromkeys(spec.dtype for spec in padded_fields)
        groups = tuple(tuple(spec for spec in padded_fields if spec.dtype == dtype) for dtype in dtypes)
        buffers = cls(padded_fields, groups, {}, torch.empty(0, dtype=torch.int32), seq_len_fill_value)
        for spec in padded_fields:
            rows = max_tokens if spec.per_token else max_requests
            buffers.tensors[spec.name] = torch.full(
                (rows,), buffers.padding_value(spec), dtype=spec.dtype, device=device
            )
        buffers.seq_lens_cpu = torch.full((max_requests,), seq_len_fill_value, dtype=torch.int32)
        return buffers

    def padding_value(self, spec: PaddedField) -> int:
        """The value padded rows of ``spec`` hold."""
        return self.seq_len_fill_value if spec.padding is None else spec.padding

    def view(self, name: str, rows: int) -> torch.Tensor:
        """The first ``rows`` rows of buffer ``name``."""
        return self.tensors[name][:rows]

    def copy_in(self, batch: ForwardBatch, num_tokens: int, num_requests: int) -> None:
        """Copy ``batch``'s fields into the first rows (none that are ``views`` already), then re-pad rows a larger
        earlier batch left behind."""
        plan = self._plan(num_tokens, num_requests)
        for copy in plan.copies:
            copy(batch)  # same-dtype fields take the fused multi-tensor path: one launch per group
        host_seq_lens = batch.seq_lens_cpu
        if self.mirror_seq_lens_cpu and host_seq_lens is not None and host_seq_lens is not plan.host_seq_lens:
            plan.host_seq_lens.copy_(host_seq_lens)
        self.pad_from(num_tokens, num_requests)

    def views(self, num_tokens: int, num_requests: int) -> Mapping[str, torch.Tensor]:
        """The first rows of every buffer (per-token fields ``num_tokens``, per-request ones ``num_requests``) by
        field name, and ``seq_lens_cpu``'s as ``"seq_lens_cpu"``: one read-only mapping of the same tensor objects
        at every call (built once per size, like the load's plan). A batch
        built from them, its values written in place, loads without a copy. Rows past them are re-padded by
        ``copy_in`` as usual; write only these rows, and only after the previous step's reads are queued (same
        stream)."""
        return self._plan(num_tokens, num_requests).views

    def _plan(self, num_tokens: int, num_requests: int) -> _LoadPlan:
        plan = self._load_plans.get((num_tokens, num_requests))
        if plan is None:
            plan = self._load_plans[(num_tokens, num_requests)] = self._plan_load(num_tokens, num_requests)
        return plan

    def _plan_load(self, num_tokens: int, num_requests: int) -> _LoadPlan:
        views = {
            spec.name: self.view(spec.name, num_tokens if spec.per_token else num_requests) for spec in self.fields
        }
        copies = tuple(
            _group_copy(tuple(views[spec.name] for spec in group), tuple(spec.name for spec in group))
            for group in self.dtype_groups
        )
        host_seq_lens = self.seq_lens_cpu[:num_requests]
        return _LoadPlan(copies, host_seq_lens, MappingProxyType({**views, "seq_lens_cpu": host_seq_lens}))

    def pad_from(self, num_tokens: int, num_requests: int) -> None:
        """Make every row from ``num_tokens`` / ``num_requests`` on hold padding (no launch when they already do)."""
        if self._dirty_tokens > num_tokens or self._dirty_requests > num_requests:
            self._repad(num_tokens, num_requests)
        self._dirty_tokens, self._dirty_requests = num_tokens, num_requests

    def _repad(self, num_tokens: int, num_requests: int) -> None:
        # Rows past this batch still hold an earlier batch's live slots and rows; a padded graph row would use them.
        for spec in self.fields:
            start, stop = (num_tokens, self._dirty_tokens) if spec.per_token else (num_requests, self._dirty_requests)
            if stop > start:
                self.tensors[spec.name][start:stop].fill_(self.padding_value(spec))
        self.seq_lens_cpu[num_requests : self._dirty_requests].fill_(self.seq_len_fill_value)

    def release(self) -> None:
        """Drop every buffer and cached view."""
        self.tensors.clear()
        self._load_plans.clear()


StaticInputs = StaticBuffers
"""Deprecated name of ``StaticBuffers`` (removed in cudagraph-runner 1.0.0)."""
