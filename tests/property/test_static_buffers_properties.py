"""``StaticBuffers`` over any sequence of decode steps, each field either copied in or written in place through
``views``: after every load the first rows hold the step's values, every row up to the largest step so far holds
padding, and a step whose fields are all views dispatches no copy."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cudagraph.engine.testing import DispatchedOps
from cudagraph.runner import ForwardBatch, ForwardMode
from cudagraph.runner.static_buffers import DECODE_FIELDS, StaticBuffers

MAX_ROWS = 8
FILL = 1
NAMES = [spec.name for spec in DECODE_FIELDS]

steps = st.lists(
    st.tuples(st.integers(1, MAX_ROWS), st.sets(st.sampled_from(NAMES)), st.integers(0, 2**20)),
    min_size=1,
    max_size=12,
)
"""(rows, the fields written in place, a seed) per step."""


def step_values(rows: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {spec.name: torch.randint(2, 1000, (rows,), generator=generator, dtype=spec.dtype) for spec in DECODE_FIELDS}


@settings(deadline=None)
@given(steps)
def test_every_load_leaves_the_step_in_front_and_padding_behind(sequence: list[tuple[int, set[str], int]]) -> None:
    inputs = StaticBuffers.allocate(DECODE_FIELDS, MAX_ROWS, MAX_ROWS, torch.device("cpu"), seq_len_fill_value=FILL)
    inputs.mirror_seq_lens_cpu = False
    largest = 0
    for rows, in_place, seed in sequence:
        values = step_values(rows, seed)
        views = inputs.views(rows, rows)
        fields = {}
        for name, tensor in values.items():
            if name in in_place:
                views[name].copy_(tensor)
                fields[name] = views[name]
            else:
                fields[name] = tensor.clone()
        batch = ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=rows, seq_lens_sum=0, **fields)
        with DispatchedOps() as ops:
            inputs.copy_in(batch, rows, rows)
        copies = [op for op in ops.computed if "copy" in op]
        if in_place == set(NAMES):
            assert copies == [], f"a step written wholly in place copied {copies}"
        largest = max(largest, rows)
        for spec in DECODE_FIELDS:
            buffer = inputs.tensors[spec.name]
            assert torch.equal(buffer[:rows], values[spec.name]), spec.name
            padding = inputs.padding_value(spec)
            assert (buffer[rows:largest] == padding).all(), f"{spec.name}: rows {rows}..{largest} not re-padded"
