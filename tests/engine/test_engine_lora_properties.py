"""Rules of the batched LoRA delta.

- ``add_lora_delta`` adds, to every token's row, ``scaling[s] * (x @ A_s^T) @ B_s^T`` of that token's slot ``s``
  (nothing for a token without an adapter), into each target's own rows, whatever the slots, ranks and indices.
- In the engine, whatever adapter each request of a batch uses (or none), every row of an extend step's and of the
  next decode step's logits is that request's logits from the model with its adapter merged into the weights.
"""

from __future__ import annotations

import functools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lora_helpers import base_model, engine, merged, random_adapter

from cudagraph.engine.batch import Request, SamplingParams
from cudagraph.engine.lora import LORA_TARGETS, ProjectionSlots, add_lora_delta
from cudagraph.engine.model_runner import ModelRunner

ADAPTER_NAMES = ("a", "b")


@settings(max_examples=60, deadline=None)
@given(
    slots=st.integers(1, 4),
    max_rank=st.integers(1, 6),
    num_tokens=st.integers(1, 9),
    data=st.data(),
)
def test_the_delta_of_each_token_is_its_slots_low_rank_product(slots, max_rank, num_tokens, data) -> None:
    seed = data.draw(st.integers(0, 2**16), label="seed")
    generator = torch.Generator().manual_seed(seed)
    targets = (LORA_TARGETS["q_proj"], LORA_TARGETS["v_proj"])
    rows, in_features, width = ((1, 5), (7, 12)), 6, 14  # rows 0, 5, 6, 12, 13: no target's
    a = torch.randn((len(targets), slots, max_rank, in_features), generator=generator, dtype=torch.float64)
    # Target t's B in its own rows of column block t, zeros elsewhere (the layout AdapterSlots keeps).
    b = torch.zeros((11, len(targets), slots, max_rank), dtype=torch.float64)  # rows 1..11
    for target, (start, stop) in enumerate(rows):
        block = torch.randn((stop - start, slots, max_rank), generator=generator, dtype=torch.float64)
        b[start - 1 : stop - 1, target] = block
    scaling = data.draw(st.lists(st.floats(-2, 2), min_size=slots, max_size=slots), label="scaling")
    table = torch.zeros((slots + 1, slots * max_rank), dtype=torch.float64)
    for slot, value in enumerate(scaling):
        table[slot, slot * max_rank : (slot + 1) * max_rank] = value
    indices = data.draw(st.lists(st.integers(0, slots), min_size=num_tokens, max_size=num_tokens), label="indices")
    x = torch.randn((num_tokens, in_features), generator=generator, dtype=torch.float64)
    out = torch.randn((num_tokens, width), generator=generator, dtype=torch.float64)
    want = out.clone()
    for token, slot in enumerate(indices):
        if slot == slots:  # the no-adapter row
            continue
        for target, (start, stop) in enumerate(rows):
            delta = (x[token] @ a[target, slot].T) @ b[start - 1 : stop - 1, target, slot].T
            want[token, start:stop] += scaling[slot] * delta
    projection = ProjectionSlots(targets, a, b, rows)
    add_lora_delta(out, x, projection, table[torch.tensor(indices)])
    torch.testing.assert_close(out, want)


@functools.cache
def engines() -> tuple[ModelRunner, dict[str | None, ModelRunner]]:
    """One LoRA engine with both adapters loaded, and an engine per adapter over its merged weights."""
    model = base_model()
    adapters = {"a": random_adapter(model, rank=8, seed=31), "b": random_adapter(model, rank=3, seed=32, alpha=6.0)}
    lora_engine = engine(model)
    for name, adapter in adapters.items():
        lora_engine.load_lora_adapter(name, adapter)
    references: dict[str | None, ModelRunner] = {None: engine(model, lora=None)}
    references.update({name: engine(merged(model, adapter), lora=None) for name, adapter in adapters.items()})
    return lora_engine, references


def two_steps(model_runner: ModelRunner, prompts: list[list[int]], names: list[str | None]) -> torch.Tensor:
    """Logits ``[2, B, vocab]`` of an extend step of ``prompts`` and of the decode step after it (each request fed
    its first prompt token again, so every engine sees the same inputs)."""
    requests = [
        model_runner.hold(Request(i, list(prompt), SamplingParams(max_new_tokens=2, lora_name=name)))
        for i, (prompt, name) in enumerate(zip(prompts, names, strict=True))
    ]
    try:
        prefill = model_runner.run(model_runner.extend_batch(requests)).clone()
        for request in requests:
            request.cached_len = len(request.prompt_ids)
            request.output_ids.append(request.prompt_ids[0])
        decode = model_runner.run(model_runner.decode_batch(requests)).clone()
    finally:
        for request in requests:
            model_runner.release(request)
    return torch.stack([prefill, decode])


@settings(max_examples=25, deadline=None)
@given(
    batch=st.lists(
        st.tuples(st.sampled_from((None, *ADAPTER_NAMES)), st.lists(st.integers(0, 511), min_size=1, max_size=12)),
        min_size=1,
        max_size=4,
    )
)
def test_every_row_is_its_requests_merged_weights_row(batch) -> None:
    lora_engine, references = engines()
    names = [name for name, _ in batch]
    prompts = [prompt for _, prompt in batch]
    got = two_steps(lora_engine, prompts, names)
    for row, (name, prompt) in enumerate(batch):
        want = two_steps(references[name], [prompt], [None])[:, 0]
        # float32 rounds the delta added apart and the merged weight differently, in proportion to the logits' size
        # (an adapter moves them by as much as the base model does): the bound is relative to the largest one.
        torch.testing.assert_close(got[:, row], want, rtol=1e-4, atol=2e-4 * max(1.0, want.abs().max().item()))
