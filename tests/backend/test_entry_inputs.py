"""What a compiling backend traces on (``largest_entry``, ``entry_to_trace``): the largest entry it is given, within
its limit, and one error naming what is missing otherwise."""

from __future__ import annotations

import pytest
import torch

from cudagraph.backend import EntryInputs
from cudagraph.backend.entry_inputs import entry_to_trace, largest_entry
from cudagraph.backend_utils import ShapeDescriptor


def entries_of(*shapes: int) -> dict[int, EntryInputs]:
    return {
        n: EntryInputs(ShapeDescriptor.decode(n), (torch.zeros(n, dtype=torch.int64),) * 2, lambda: None)
        for n in shapes
    }


def test_the_largest_entry_within_the_limit_is_traced() -> None:
    entries = entries_of(1, 4, 2, 16)
    assert largest_entry(entries) is entries[16]
    assert largest_entry(entries, up_to=8) is entries[4]
    assert largest_entry(entries, up_to=0) is None
    forward, entry = entry_to_trace("full", torch.sin, entries, up_to=3)
    assert forward is torch.sin and entry is entries[2] and entry.tokens == 2


@pytest.mark.parametrize(
    ("forward", "shapes", "up_to"), [(None, (4,), None), (torch.sin, (), None), (torch.sin, (8,), 4)]
)
def test_a_missing_forward_or_entry_is_one_error_naming_both(forward, shapes, up_to) -> None:
    with pytest.raises(TypeError, match=r"needs the forward to trace.*got forward .* and entries \[") as raised:
        entry_to_trace("tc_piecewise", forward, entries_of(*shapes), up_to)
    assert str(list(shapes)) in str(raised.value)
    assert (f"an entry up to {up_to}" in str(raised.value)) is (up_to is not None)
