"""The Triton kernel set against textbook formulas in float64, the in-place writes, and a whole model on the set
against the same model on the torch set: on the GPU where there is one, else on CPU tensors through Triton's
interpreter (``TRITON_INTERPRET=1``, set by ``tests/conftest.py``). float32 and float16 only: the interpreter rounds
float16 as the GPU does but truncates bfloat16, so bfloat16 numerics are the GPU tests' job.
"""

from __future__ import annotations

import os
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is not installed: pip install triton (CUDA builds of torch bring it)")

from cudagraph.engine.kernels import TORCH_KERNELS
from cudagraph.engine.kernels.rotary import rotary_cos_sin_halves_table
from cudagraph.engine.kernels.triton import layer_set as triton_layer_set
from cudagraph.engine.kernels.triton import ops as triton_ops
from cudagraph.engine.model import ModelConfig, model_config_from_preset, random_model
from cudagraph.engine.model.reference import dense_attend

EPS = 1e-6
DTYPES = [torch.float32, torch.float16]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: {"atol": 2e-5, "rtol": 2e-5}, torch.float16: {"atol": 2e-3, "rtol": 2e-3}}


@pytest.fixture(scope="module")
def ops() -> ModuleType:
    """``kernels.triton.ops``, on CPU tensors through the interpreter where there is no CUDA device."""
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip(
            "no CUDA device and Triton's interpreter is off: set TRITON_INTERPRET=1 before torch is imported "
            "(tests/conftest.py does where /dev/nvidiactl is absent)"
        )
    return triton_ops


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def textbook_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    exact = x.double()
    return exact * torch.rsqrt(exact.pow(2).mean(-1, keepdim=True) + EPS) * weight.double()


def close(have: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(have.double(), want.double(), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3])
def test_norms_match_the_formula_and_the_fused_add_grows_the_residual_in_place(
    ops: ModuleType, rows: int, dtype: torch.dtype, generator: torch.Generator
) -> None:
    width = 80  # not a power of two: the masked tail counts
    x, residual = (torch.randn(rows, width, generator=generator).to(DEVICE, dtype) for _ in range(2))
    weight = (1 + 0.1 * torch.randn(width, generator=generator)).to(DEVICE, dtype)
    close(ops.rms_norm(x, weight, EPS), textbook_rms_norm(x, weight), dtype)
    summed = (x.double() + residual.double()).to(dtype)
    x_storage, residual_storage = x.data_ptr(), residual.data_ptr()
    normed, stream = ops.add_rms_norm(x, residual, weight, EPS)
    assert normed.data_ptr() == x_storage and stream.data_ptr() == residual_storage, "both written in place"
    assert torch.equal(stream, summed), "the residual sum is rounded to the model dtype once"
    close(normed, textbook_rms_norm(summed, weight), dtype)


def textbook_rotate(heads: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """Neox rotary of ``heads`` ``[T, H, D]`` by ``cos_sin`` rows ``[T, D]`` (cos then sin halves), in float64."""
    half = heads.shape[-1] // 2
    x1, x2 = heads[..., :half].double(), heads[..., half:].double()
    cos, sin = cos_sin[:, None, :half].double(), cos_sin[:, None, half:].double()
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


@pytest.mark.parametrize("store", [False, True], ids=["in-place", "and-store"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("normed", [True, False], ids=["qwen3", "llama"])
def test_qk_norm_rope_norms_and_rotates_q_and_k_in_place_and_can_store_k_and_v(
    ops: ModuleType, normed: bool, dtype: torch.dtype, store: bool, generator: torch.Generator
) -> None:
    """12 rotated heads (two programs, the second one masked; 15 with the v heads when storing, masked too): q and
    k normed and rotated in the projection, v left alone; storing, each token's rotated keys and its values land in
    its slot's row of the cache (keys then values) and no other row changes."""
    num_q, num_k, head_dim, tokens = 9, 3, 32, 4
    config = model_config_from_preset("tiny-qwen3-random").with_overrides(head_dim=head_dim)
    table = rotary_cos_sin_halves_table(config, DEVICE)
    positions = torch.tensor([0, 7, 3, 120], device=DEVICE)
    # A projection row wider than its heads (a column slice, as a layer's qkv is for T > 1 after unflatten).
    projection = torch.randn(tokens, (num_q + 2 * num_k) * head_dim + 16, generator=generator).to(DEVICE, dtype)
    heads = projection[:, :-16].unflatten(-1, (-1, head_dim))
    before = heads.clone()
    weight = (1 + 0.2 * torch.randn(num_q + num_k, head_dim, generator=generator)).to(DEVICE, dtype)
    tail = projection[:, -16:].clone()
    cache = torch.randn(9, 2, num_k, head_dim, generator=generator).to(DEVICE, dtype)
    cache_before = cache.clone()
    slots = torch.tensor([5, 0, 8, 2], device=DEVICE)
    destination = (cache, slots) if store else None
    ops.qk_norm_rope(heads, weight if normed else None, num_q, num_k, EPS, table, positions, destination)
    expected = before[:, : num_q + num_k].double()
    if normed:
        expected = textbook_rms_norm(expected, weight).to(dtype)
    close(heads[:, : num_q + num_k], textbook_rotate(expected, table[positions]), dtype)
    assert torch.equal(heads[:, num_q + num_k :], before[:, num_q + num_k :]), "v heads untouched"
    assert torch.equal(projection[:, -16:], tail), "nothing written past the heads"
    if not store:
        assert torch.equal(cache, cache_before)
        return
    assert torch.equal(cache[slots, 0], heads[:, num_q : num_q + num_k]), "keys stored as rotated in the projection"
    assert torch.equal(cache[slots, 1], before[:, num_q + num_k :]), "values stored as projected"
    others = [row for row in range(cache.shape[0]) if row not in slots.tolist()]
    assert torch.equal(cache[others], cache_before[others]), "no other slot written"


def test_qk_norm_rope_refuses_a_cache_of_another_layout(ops: ModuleType) -> None:
    heads = torch.zeros(1, 4, 8, device=DEVICE)
    table = torch.zeros(4, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"contiguous \[slots, 2, 1, 8\] buffer, got \(3, 1, 2, 8\)"):
        ops.qk_norm_rope(
            heads,
            None,
            2,
            1,
            EPS,
            table,
            torch.zeros(1, dtype=torch.int64, device=DEVICE),
            (torch.zeros(3, 1, 2, 8, device=DEVICE), torch.zeros(1, dtype=torch.int64, device=DEVICE)),
        )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 8])
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_is_the_projection_and_fuses_the_activation(
    ops: ModuleType, rows: int, bias: bool, dtype: torch.dtype, generator: torch.Generator
) -> None:
    """At the table's tile where it covers ``rows``, and at a small tile that masks rows (3 of 4), columns and the
    last reduction step."""
    n, k = 44, 200  # neither a multiple of the tiles: masked columns and a masked last reduction step
    weight = (torch.randn(n, k, generator=generator) / k**0.5).to(DEVICE, dtype)
    bias_vector = torch.randn(n, generator=generator).to(DEVICE, dtype) if bias else None
    gate_up = torch.randn(rows, 2 * k + 8, generator=generator).to(DEVICE, dtype)[:, :-8]  # row stride > row
    x = gate_up[:, :k]
    want = F.linear(x.double(), weight.double(), None if bias_vector is None else bias_vector.double())
    activation = (F.silu(gate_up[:, :k].double()) * gate_up[:, k:].double()).to(dtype)
    tiles = [ops.GemvTile(max_rows=8, block_n=8, block_k=64)] + [ops.gemv_tile(rows)] * (
        rows <= ops.GEMV_TILES[-1].max_rows
    )
    for tile in tiles:
        close(ops.gemv(x, weight, bias_vector, tile=tile), want, dtype)
        close(
            ops.gemv(gate_up, weight, silu_mul=True, tile=tile), F.linear(activation.double(), weight.double()), dtype
        )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3])
@pytest.mark.parametrize("bias", [False, True])
def test_add_norm_gemv_is_the_fused_add_norm_then_the_projection_and_leaves_its_inputs(
    ops: ModuleType, rows: int, bias: bool, dtype: torch.dtype, generator: torch.Generator
) -> None:
    """The projection of the normed sum, at the table's tile and at a small one that masks rows, columns and the
    last reduction step of both passes (the norm's and the projection's); the sum comes back rounded, as
    ``add_rms_norm`` rounds it, in a new tensor."""
    n, k = 44, 200
    weight = (torch.randn(n, k, generator=generator) / k**0.5).to(DEVICE, dtype)
    bias_vector = torch.randn(n, generator=generator).to(DEVICE, dtype) if bias else None
    norm_weight = (1 + 0.1 * torch.randn(k, generator=generator)).to(DEVICE, dtype)
    x = torch.randn(rows, k + 8, generator=generator).to(DEVICE, dtype)[:, :k]  # row stride > row
    residual = torch.randn(rows, k, generator=generator).to(DEVICE, dtype)
    x_before, residual_before = x.clone(), residual.clone()
    summed = (x.double() + residual.double()).to(dtype)
    normed = textbook_rms_norm(summed, norm_weight).to(dtype)
    want = F.linear(normed.double(), weight.double(), None if bias_vector is None else bias_vector.double())
    tiles = [ops.GemvTile(max_rows=4, block_n=8, block_k=64)] + [ops.gemv_tile(rows)] * (
        rows <= ops.GEMV_TILES[-1].max_rows
    )
    for tile in tiles:
        out, stream = ops.add_norm_gemv(x, residual, norm_weight, EPS, weight, bias_vector, tile=tile)
        close(out, want, dtype)
        assert torch.equal(stream, summed), "the stream is the rounded sum"
        assert torch.equal(x, x_before) and torch.equal(residual, residual_before), "the inputs are left as they are"
        # The same numbers as the two kernels it fuses, whose norm rounds once to the model dtype.
        unfused_normed, _ = ops.add_rms_norm(x.clone(), residual.clone(), norm_weight, EPS)
        close(out, ops.gemv(unfused_normed, weight, bias_vector, tile=tile).double(), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_aligned_and_unaligned_inputs_in_any_order_give_the_right_results(
    ops: ModuleType, dtype: torch.dtype, generator: torch.Generator
) -> None:
    """On CUDA each launch reuses the kernel compiled for its specialization (``backend_utils.FastLauncher``): an
    input whose address is not a multiple of 16 bytes needs a kernel of its own, and an aligned one after it the
    first kernel again."""
    n, k = 64, 256
    weight = (torch.randn(n, k, generator=generator) / k**0.5).to(DEVICE, dtype)
    norm_weight = (1 + 0.1 * torch.randn(k, generator=generator)).to(DEVICE, dtype)
    rows = torch.randn(2, k + 1, generator=generator).to(DEVICE, dtype)
    aligned, unaligned = rows[:1, :k], rows[1:, 1:]
    assert aligned.data_ptr() % 16 == 0 and unaligned.data_ptr() % 16 != 0
    for x in (aligned, unaligned, aligned, unaligned):
        close(ops.gemv(x, weight), F.linear(x.double(), weight.double()), dtype)
        close(ops.rms_norm(x, norm_weight, EPS), textbook_rms_norm(x, norm_weight), dtype)


def test_add_norm_gemv_says_what_it_needs(ops: ModuleType) -> None:
    with pytest.raises(ValueError, match=r"needs x and residual of 8 columns and a norm weight of 8, got \(1, 8\), "):
        ops.add_norm_gemv(torch.ones(1, 8), torch.ones(1, 4), torch.ones(8), EPS, torch.ones(4, 8))
    widest = ops.GEMV_TILES[-1].max_rows
    with pytest.raises(ValueError, match=f"at most {widest} rows, got {widest + 1}"):
        ops.add_norm_gemv(*(torch.ones(widest + 1, 8),) * 2, torch.ones(8), EPS, torch.ones(4, 8))


def test_gemv_says_what_it_covers(ops: ModuleType) -> None:
    widest = ops.GEMV_TILES[-1].max_rows
    assert ops.gemv_tile(widest) is ops.GEMV_TILES[-1] and ops.gemv_tile(widest + 1) is None
    with pytest.raises(ValueError, match=f"at most {widest} rows, got {widest + 1}"):
        ops.gemv(torch.ones(widest + 1, 8), torch.ones(4, 8))
    with pytest.raises(ValueError, match=r"needs x of 16 columns \(gate then up\), got 8"):
        ops.gemv(torch.ones(1, 8), torch.ones(4, 8), silu_mul=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_the_formula(ops: ModuleType, dtype: torch.dtype, generator: torch.Generator) -> None:
    width = ops.ELEMENTWISE_BLOCK + 40  # two programs a row, the second one masked
    gate_up = torch.randn(3, 2 * width, generator=generator).to(DEVICE, dtype)
    want = F.silu(gate_up[:, :width].double()) * gate_up[:, width:].double()
    close(ops.silu_and_mul(gate_up), want, dtype)


FAMILIES = {
    "qwen3": model_config_from_preset("tiny-qwen3-random"),
    "llama": model_config_from_preset("tiny-llama-random"),
    "qwen2": model_config_from_preset("tiny-llama-random").with_overrides(model_type="qwen2"),
}


class StoringAttend:
    """A dense ``attend`` that offers a KV cache: it records what reached it and checks that what the kernels stored
    at its destination is the keys and values it is given."""

    def __init__(self, config: ModelConfig, tokens: int) -> None:
        self.dense = dense_attend(config)
        self.caches = [
            torch.zeros(tokens + 3, 2, config.num_kv_heads, config.head_dim, device=DEVICE)
            for _ in range(config.num_layers)
        ]
        self.slots = torch.arange(tokens, device=DEVICE) + 2  # slots 0, 1 and the last stay empty
        self.stored: list[bool] = []

    def kv_destination(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.caches[layer_id], self.slots

    def __call__(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, kv_stored: bool = False
    ) -> torch.Tensor:
        self.stored.append(kv_stored)
        cache = self.caches[layer_id]
        heads = (-1, cache.shape[2], cache.shape[3])
        if kv_stored:
            assert torch.equal(cache[self.slots, 0], k.reshape(heads)), f"layer {layer_id}: keys"
            assert torch.equal(cache[self.slots, 1], v.reshape(heads)), f"layer {layer_id}: values"
            assert not cache[[0, 1, -1]].any(), "no other slot written"
        return self.dense(layer_id, q, k, v)


TOKEN_COUNTS = {"gemv": 1, "gemv-2-rows": 2, "cublas": 12}
"""The token counts of a step, by the path its projections take."""


# every family at each path; the two-row gemv (the interpreter's slowest) of Llama and Qwen2 is `slow`
@pytest.mark.parametrize(
    ("tokens", "family"),
    [
        pytest.param(
            tokens,
            family,
            id=f"{path}-{family}",
            marks=[pytest.mark.slow] if path == "gemv-2-rows" and family != "qwen3" else [],
        )
        for path, tokens in TOKEN_COUNTS.items()
        for family in FAMILIES
    ],
)
def test_a_model_on_the_triton_set_computes_what_the_torch_set_computes(
    ops: ModuleType, family: str, tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every layer's wiring: projections (with Qwen2's bias), head norms and rotary in place, the activation fused
    into the down projection (and unfused past the gemv tiles: 12 rows), float32 on the CPU."""
    monkeypatch.setattr(triton_layer_set, "ops", ops)
    model = random_model(FAMILIES[family], seed=5, dtype="float32", device=DEVICE)
    assert model.config.qkv_bias == (family == "qwen2") and model.config.qk_norm == (family == "qwen3")
    input_ids = torch.randint(0, model.config.vocab_size, (tokens,), generator=torch.Generator().manual_seed(1))
    input_ids, positions = input_ids.to(DEVICE), torch.arange(tokens, device=DEVICE)
    want = model(input_ids, positions, dense_attend(model.config))
    model.use_kernels(triton_layer_set.TritonKernels())
    have = model(input_ids, positions, dense_attend(model.config))
    model.use_kernels(TORCH_KERNELS)
    torch.testing.assert_close(have, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_the_triton_set_stores_keys_and_values_where_attend_says_and_attend_skips_its_store(
    ops: ModuleType, family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an ``attend`` that names a destination, every layer's rotary kernel stores its keys and values there
    (the torch set leaves the store to ``attend``), and the logits stay the torch set's."""
    monkeypatch.setattr(triton_layer_set, "ops", ops)
    model = random_model(FAMILIES[family], seed=5, dtype="float32", device=DEVICE)
    tokens = 3
    input_ids = torch.randint(0, model.config.vocab_size, (tokens,), generator=torch.Generator().manual_seed(2))
    input_ids, positions = input_ids.to(DEVICE), torch.arange(tokens, device=DEVICE)
    plain = StoringAttend(model.config, tokens)
    want = model(input_ids, positions, plain)
    assert plain.stored == [False] * model.config.num_layers and not any(c.any() for c in plain.caches)
    model.use_kernels(triton_layer_set.TritonKernels())
    fused = StoringAttend(model.config, tokens)
    have = model(input_ids, positions, fused)
    model.use_kernels(TORCH_KERNELS)
    assert fused.stored == [True] * model.config.num_layers
    torch.testing.assert_close(have, want, atol=1e-4, rtol=1e-4)
