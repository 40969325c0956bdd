"""What a backend is built with: the forward it may trace and, for each entry it will capture, the shape descriptor
and the static inputs the runner captures it with.

A runner hands these to ``BaseCudaGraphBackend.prepare`` before its capture loop, so that a backend never reads a
runner's or an engine's attributes: it graphs what it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from cudagraph.backend_utils import ShapeDescriptor


@dataclass(frozen=True)
class EntryInputs:
    """One entry (a captured shape) as its runner feeds it: what it serves and the static inputs it reads.

    Example:
        >>> ids, positions = torch.zeros(4, dtype=torch.int64), torch.arange(4)
        >>> entry = EntryInputs(ShapeDescriptor.decode(4), (ids, positions), lambda: None)
        >>> str(entry.descriptor), entry.tokens
        ('tokens=4 requests=4 query_len=1', 4)
    """

    descriptor: ShapeDescriptor
    """The shape the entry's graph serves (what a backend keys the entry by, and dispatches captures on)."""
    token_inputs: tuple[torch.Tensor, ...]
    """The static ``input_ids`` and ``positions`` of the entry: what the forward to trace is called with, the first
    dimension (tokens) marked dynamic when it is compiled."""
    run_step: Callable[[], Any]
    """One whole step on these static inputs (the runner's forward of its static batch), which calls the forward to
    trace once: compiling runs it so the compiler sees the step's real inputs."""

    @property
    def tokens(self) -> int:
        """Token rows of the entry."""
        return self.descriptor.tokens


def largest_entry(entries: Mapping[int, EntryInputs], up_to: int | None = None) -> EntryInputs | None:
    """The entry of the largest shape in ``entries`` (at most ``up_to``, when given), or ``None`` when there is none:
    the one a compiling backend traces on, so that one compilation serves every smaller shape."""
    shapes = [shape for shape in entries if up_to is None or shape <= up_to]
    return entries[max(shapes)] if shapes else None


def entry_to_trace(
    what: str, model_forward: Callable[..., Any] | None, entries: Mapping[int, EntryInputs], up_to: int | None = None
) -> tuple[Callable[..., Any], EntryInputs]:
    """The forward to trace and the largest entry (at most ``up_to``) to trace it on, for ``what`` (the compiling
    backend, in the message); a ``TypeError`` saying what is missing when the caller gave no forward or no such
    entry."""
    entry = largest_entry(entries, up_to)
    if model_forward is None or entry is None:
        within = f" up to {up_to}" if up_to is not None else ""
        raise TypeError(
            f"{what} needs the forward to trace, model_forward(input_ids, positions) -> hidden (the traceable part of "
            f"the host's forward), and an entry{within} to trace it on; got forward {model_forward!r} and entries "
            f"{sorted(entries)}"
        )
    return model_forward, entry
