"""The Triton set's fused LoRA delta on CUDA: the two kernels against the adapters' torch reference
(``lora.add_lora_delta``) at Llama-3-8B's shapes and at a tiny one whose target rows are not block aligned, for
q/k/v (three targets) and o (one), over decode and prefill token counts and mixes of slots with the no-adapter row;
and LoRA decode over the Triton set through ``full`` and ``breakable`` graphs giving eager's greedy tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import pytest
import torch
from test_gpu_lora import (
    DECODE_BUCKETS,
    NAMES,
    engine,
    replayed_buckets,
    tokens,
)

from cudagraph.config import Backend
from cudagraph.engine.kernels.triton import lora as triton_lora
from cudagraph.engine.lora import LORA_TARGETS, ProjectionSlots, add_lora_delta
from cudagraph.engine.model_runner import ModelRunner

pytestmark = pytest.mark.gpu

TOKENS = (1, 2, 7, 8, 33, 300)


@dataclasses.dataclass(frozen=True)
class Shape:
    """A projection's sizes: its input width, its output rows and, per target, the rows it adds to."""

    in_features: int
    out_features: int
    rows: tuple[tuple[int, int], ...]
    slots: int
    rank: int


SHAPES = {
    "8b qkv": Shape(4096, 6144, ((0, 4096), (4096, 5120), (5120, 6144)), slots=8, rank=16),
    "8b o": Shape(4096, 4096, ((0, 4096),), slots=8, rank=16),
    "tiny qkv, rows not block aligned": Shape(40, 91, ((3, 37), (37, 50), (61, 90)), slots=3, rank=5),
    "tiny o, rows not block aligned": Shape(40, 91, ((5, 86),), slots=3, rank=5),
}
ROUNDING = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}
"""A delta's error bound against float64, relative to the largest output value (bfloat16 keeps 8 bits)."""


def case(shape: Shape, num_tokens: int, dtype: torch.dtype, seed: int):
    """Random slot tensors in the ``AdapterSlots`` layout, a step's input, output and scales (every slot and the
    no-adapter row among the tokens)."""
    generator = torch.Generator().manual_seed(seed)
    row_start, row_stop = min(start for start, _ in shape.rows), max(stop for _, stop in shape.rows)
    targets = len(shape.rows)
    a = torch.randn((targets, shape.slots, shape.rank, shape.in_features), generator=generator) * 0.05
    b = torch.zeros((row_stop - row_start, targets, shape.slots, shape.rank))
    for target, (start, stop) in enumerate(shape.rows):
        b[start - row_start : stop - row_start, target] = torch.randn(
            (stop - start, shape.slots, shape.rank), generator=generator
        )
    table = torch.zeros((shape.slots + 1, shape.slots * shape.rank))
    for slot in range(shape.slots):
        table[slot, slot * shape.rank : (slot + 1) * shape.rank] = 0.5 + 0.25 * slot
    indices = (torch.arange(num_tokens) % (shape.slots + 1))[torch.randperm(num_tokens, generator=generator)]
    names = ("q_proj", "k_proj", "v_proj") if targets > 1 else ("o_proj",)
    projection = ProjectionSlots(
        tuple(LORA_TARGETS[name] for name in names), a.cuda().to(dtype), b.cuda().to(dtype), shape.rows
    )
    x = torch.randn((num_tokens, shape.in_features), generator=generator).cuda().to(dtype)
    out = torch.randn((num_tokens, shape.out_features), generator=generator).cuda().to(dtype)
    return projection, x, out, table[indices].cuda().to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_the_fused_delta_adds_what_the_torch_reference_adds(shape_name: str, num_tokens: int, dtype) -> None:
    shape = SHAPES[shape_name]
    projection, x, out, scales = case(shape, num_tokens, dtype, seed=num_tokens)
    exact = out.double()
    add_lora_delta(
        exact, x.double(), dataclasses.replace(projection, a=projection.a.double(), b=projection.b.double()),
        scales.double(),
    )  # fmt: skip
    reference, fused = out.clone(), out.clone()
    add_lora_delta(reference, x, projection, scales)
    triton_lora.lora_delta(fused, x, projection.a, projection.b, scales, projection.rows)
    torch.cuda.synchronize()
    untouched = torch.ones(shape.out_features, dtype=torch.bool, device="cuda")
    for start, stop in shape.rows:
        untouched[start:stop] = False
    assert torch.equal(fused[:, untouched], out[:, untouched])
    assert not torch.equal(fused, out)
    bound = ROUNDING[dtype] * exact.abs().max().item()
    torch.testing.assert_close(fused.double(), exact, atol=bound, rtol=0)
    torch.testing.assert_close(reference.double(), exact, atol=bound, rtol=0)  # the bound holds the reference too
    torch.testing.assert_close(fused.double(), reference.double(), atol=2 * bound, rtol=0)


@contextlib.contextmanager
def triton_engine(backend: Backend) -> Iterator[ModelRunner]:
    """``test_gpu_lora``'s engine on the Triton kernel set, checked to run its fused delta."""
    with engine(backend, kernel_backend="triton") as model_runner:
        assert model_runner.kernels.name == "triton" and model_runner.kernels.lora_delta is triton_lora.lora_delta
        yield model_runner


@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE])
def test_lora_decode_through_the_fused_delta_gives_eager_tokens_at_every_bucket(backend: Backend) -> None:
    with triton_engine(Backend.DISABLED) as eager:
        want_mixed, want_plain = tokens(eager), tokens(eager, (None,))
    with triton_engine(backend) as graphed:
        lora_runner = graphed.lora_decode_cuda_graph_runner
        assert lora_runner is not None and lora_runner.captured_buckets == DECODE_BUCKETS
        got_mixed = tokens(graphed, NAMES)
        assert replayed_buckets(lora_runner) == list(DECODE_BUCKETS)
        assert lora_runner.metrics.eager == 0
    assert got_mixed == want_mixed
    assert want_mixed != want_plain  # the adapters change the tokens of the requests that use them
