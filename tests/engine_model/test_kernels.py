"""The torch kernel set against textbook formulas (float64), the in-place writes that keep keys and values side by
side in the fused projection, and the fused kernels' rotary table layout (checked on the CPU with the formula
FlashInfer's rotary kernel computes)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cudagraph.engine.kernels.layer_set import TORCH_KERNELS, QKHeads
from cudagraph.engine.kernels.out_views import compute_into
from cudagraph.engine.kernels.rotary import apply_rotary, rotary_cos_sin_halves_table, rotary_cos_sin_table
from cudagraph.engine.model import dense_attend, model_config_from_preset, random_model

EPS = 1e-6
TOKENS = 5


def textbook_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    exact = x.double()
    return exact * torch.rsqrt(exact.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def test_rms_norm_and_add_rms_norm_match_the_formula_and_grow_the_residual_in_place(
    generator: torch.Generator,
) -> None:
    x, residual = torch.randn(TOKENS, 48, generator=generator), torch.randn(TOKENS, 48, generator=generator)
    weight = 1 + 0.1 * torch.randn(48, generator=generator)
    torch.testing.assert_close(TORCH_KERNELS.rms_norm(x, weight, EPS).double(), textbook_rms_norm(x, weight))
    expected_sum = x.double() + residual.double()
    original = residual
    normed, summed = TORCH_KERNELS.add_rms_norm(x, residual, weight, EPS)
    assert summed is original, "the residual stream is updated in place"
    torch.testing.assert_close(summed.double(), expected_sum)
    torch.testing.assert_close(normed.double(), textbook_rms_norm(expected_sum, weight))


def test_qk_rms_norm_scales_q_and_k_heads_by_their_own_rows_in_place_and_leaves_v_alone(
    generator: torch.Generator,
) -> None:
    num_q, num_k, head_dim = 4, 2, 16
    heads = torch.randn(TOKENS, num_q + 2 * num_k, head_dim, generator=generator)
    before = heads.clone()
    q_weight, k_weight = (
        1 + 0.1 * torch.randn(head_dim, generator=generator),
        torch.randn(head_dim, generator=generator),
    )
    weight = torch.cat((q_weight.expand(num_q, -1), k_weight.expand(num_k, -1)))
    result = TORCH_KERNELS.qk_rms_norm(heads, weight, num_q, EPS)
    assert result.data_ptr() == heads.data_ptr() and result.shape == (TOKENS, num_q + num_k, head_dim)
    torch.testing.assert_close(heads[:, :num_q].double(), textbook_rms_norm(before[:, :num_q], q_weight))
    torch.testing.assert_close(
        heads[:, num_q : num_q + num_k].double(), textbook_rms_norm(before[:, num_q:], k_weight)[:, :num_k]
    )
    assert torch.equal(heads[:, num_q + num_k :], before[:, num_q + num_k :])


def test_rotate_writes_into_the_heads_what_apply_rotary_returns() -> None:
    config = model_config_from_preset("tiny-qwen3-random")
    table = TORCH_KERNELS.rotary_table(config, torch.float32, torch.device("cpu"))
    positions = torch.tensor([0, 3, 17, 900, 4095])
    heads = torch.randn(len(positions), config.num_heads + config.num_kv_heads, config.head_dim)
    expected = apply_rotary(heads, table[positions])
    rotary = TORCH_KERNELS.rotary_step(table, positions)
    result = TORCH_KERNELS.rotate(heads, config.num_heads, rotary)
    assert result.data_ptr() == heads.data_ptr()
    assert torch.equal(heads, expected)
    assert not torch.equal(heads[1:], apply_rotary(heads, table[positions])[1:]), "rotating twice moves them again"


def test_silu_and_mul_is_silu_of_the_gate_half_times_the_up_half(generator: torch.Generator) -> None:
    gate_up = torch.randn(TOKENS, 2 * 24, generator=generator)
    gate, up = gate_up.double().chunk(2, dim=-1)
    torch.testing.assert_close(TORCH_KERNELS.silu_and_mul(gate_up).double(), gate * torch.sigmoid(gate) * up)


def test_compute_into_writes_eagerly_and_returns_a_new_tensor_when_compiled() -> None:
    out = torch.zeros(3, 8)[:, :4]  # a strided view, as the heads of a fused projection are
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    assert compute_into(out, torch.mul, a, b) is out and torch.equal(out, a * b)

    @torch.compile(backend="eager", fullgraph=True)
    def compiled(target: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return compute_into(target, torch.mul, a, b)

    fresh = torch.zeros(3, 8)[:, :4]
    result = compiled(fresh, a, b)
    assert torch.equal(result, a * b) and result.data_ptr() != fresh.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_halves_table_rotates_as_the_signed_table_does(dtype: torch.dtype) -> None:
    """The fused kernels' table (float32 cos | sin of the half angles): applied with the formula FlashInfer's Neox
    rotary computes (float32 math, one rounding), it rotates as the torch kernels' table does."""
    config = model_config_from_preset("qwen3-0.6b-random").with_overrides(max_position_embeddings=5000)
    halves = rotary_cos_sin_halves_table(config, "cpu")
    assert halves.dtype == torch.float32 and halves.shape == (5000, config.head_dim)
    positions = torch.tensor([0, 1, 63, 1000, 4999])
    heads = torch.randn(len(positions), 3, config.head_dim).to(dtype)
    half = config.head_dim // 2
    cos, sin = halves[positions, None, :half], halves[positions, None, half:]
    x1, x2 = heads[..., :half].float(), heads[..., half:].float()
    fused = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(dtype)
    reference = apply_rotary(heads, rotary_cos_sin_table(config, dtype, "cpu")[positions])
    tolerance = 1e-5 if dtype == torch.float32 else 2**-7
    torch.testing.assert_close(fused.float(), reference.float(), rtol=tolerance, atol=tolerance)


def test_layers_follow_the_kernels_the_model_uses() -> None:
    model = random_model(model_config_from_preset("tiny-qwen3-random"))
    calls: list[str] = []

    class Recording(type(TORCH_KERNELS)):  # type: ignore[misc]
        name = "recording"

        def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
            calls.append("silu_and_mul")
            return super().silu_and_mul(gate_up)

    reference = model(torch.arange(4), torch.arange(4), dense_attend(model.config))
    model.use_kernels(Recording())
    assert torch.equal(model(torch.arange(4), torch.arange(4), dense_attend(model.config)), reference)
    assert calls == ["silu_and_mul"] * model.config.num_layers
    model.use_kernels(TORCH_KERNELS)
    model(torch.arange(4), torch.arange(4), dense_attend(model.config))
    assert len(calls) == model.config.num_layers


def test_rms_norm_of_the_head_norm_is_the_reference_rounding_order() -> None:
    """Round the normed heads to bfloat16 before the scale, as the reference does (not one fused rounding)."""
    heads = torch.randn(TOKENS, 3, 64).to(torch.bfloat16)
    weight = (1 + 0.1 * torch.randn(2, 64)).to(torch.bfloat16)
    expected = F.rms_norm(heads.float(), (64,), eps=EPS).to(torch.bfloat16)[:, :2] * weight
    assert torch.equal(TORCH_KERNELS.qk_rms_norm(heads.clone(), weight, 1, EPS), expected)


def test_the_composed_store_writes_rotated_keys_and_values_after_rotary(generator: torch.Generator) -> None:
    """The torch set's ``norm_rotate_and_store``: ``norm_and_rotate``, then the k and v heads into their slots."""
    config = model_config_from_preset("tiny-qwen3-random")
    num_q, num_k, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
    heads = torch.randn(TOKENS, num_q + 2 * num_k, head_dim, generator=generator)
    weight = 1 + 0.1 * torch.randn(num_q + num_k, head_dim, generator=generator)
    rotary = TORCH_KERNELS.rotary_step(TORCH_KERNELS.rotary_table(config, torch.float32, "cpu"), torch.arange(TOKENS))
    q_and_k = QKHeads(num_q, num_k, weight, EPS)
    expected = TORCH_KERNELS.norm_and_rotate(heads.clone(), q_and_k, rotary)
    cache = torch.zeros(TOKENS + 2, 2, num_k, head_dim)
    slots = torch.arange(TOKENS) + 1
    values = heads[:, num_q + num_k :].clone()
    qk = TORCH_KERNELS.norm_rotate_and_store(heads, q_and_k, rotary, (cache, slots))
    assert torch.equal(qk, expected)
    assert torch.equal(cache[slots, 0], expected[:, num_q:]) and torch.equal(cache[slots, 1], values)
    assert not cache[0].any() and not cache[-1].any()
