"""The forward contract: shapes, what ``attend`` receives, rotary, chunked decoding through a cache, random init."""

from __future__ import annotations

import pytest
import torch

from cudagraph.engine.kernels.rotary import apply_rotary, rope_inverse_frequencies, rotary_cos_sin_table
from cudagraph.engine.model import (
    CausalLM,
    ModelConfig,
    RopeScaling,
    dense_attend,
    dense_causal_attention,
    model_config_from_preset,
    random_model,
    reference_greedy,
    reference_logits,
)

PROMPT = [3, 141, 59, 26, 5, 358, 97, 9, 32, 384]


@pytest.mark.parametrize("preset", ["tiny-qwen3-random", "tiny-llama-random"])
def test_forward_shapes_and_float32_logits(preset: str) -> None:
    model = random_model(model_config_from_preset(preset))
    ids = torch.tensor(PROMPT)
    hidden = model(ids, torch.arange(len(PROMPT)), dense_attend(model.config))
    assert hidden.shape == (len(PROMPT), model.config.hidden_size) and hidden.dtype == torch.float32
    logits = model.compute_logits(hidden[-2:])
    assert logits.shape == (2, model.config.vocab_size) and logits.dtype == torch.float32


def test_bfloat16_model_returns_float32_logits_close_to_float32_model() -> None:
    config = model_config_from_preset("tiny-qwen3-random")
    exact = reference_logits(random_model(config, seed=4), PROMPT)
    rounded = reference_logits(random_model(config, seed=4, dtype="bfloat16"), PROMPT)
    assert rounded.dtype == torch.float32
    assert (rounded - exact).abs().max() < 0.1 * exact.abs().max()


def test_random_logits_are_spread_deterministic_and_seeded() -> None:
    config = model_config_from_preset("tiny-llama-random")
    logits = reference_logits(random_model(config, seed=0), PROMPT)
    assert 0.5 < logits.std() < 5.0
    assert len(set(logits.argmax(-1).tolist())) > len(PROMPT) // 2  # not one token everywhere
    assert torch.equal(logits, reference_logits(random_model(config, seed=0), PROMPT))
    assert not torch.equal(logits, reference_logits(random_model(config, seed=1), PROMPT))


def test_attend_gets_rotated_normed_projections_per_layer() -> None:
    config = model_config_from_preset("tiny-qwen3-random")
    model = random_model(config)
    calls: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def recording_attend(layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        calls.append((layer_id, q.clone(), k.clone(), v.clone()))
        return dense_attend(config)(layer_id, q, k, v)

    tokens = len(PROMPT)
    model(torch.tensor(PROMPT), torch.arange(tokens), recording_attend)
    assert [call[0] for call in calls] == list(range(config.num_layers))
    _, q, k, v = calls[0]
    assert q.shape == (tokens, config.q_size) and k.shape == v.shape == (tokens, config.kv_size)
    # Recompute layer 0's projections by hand, unfused, the textbook way.
    attn = model.layers[0].self_attn
    x = model.layers[0].input_layernorm(model.embed_tokens[torch.tensor(PROMPT)])
    q_ref, k_ref, v_ref = (x @ attn.qkv_weight.T).split([config.q_size, config.kv_size, config.kv_size], dim=-1)
    norm_weight = attn.qk_norm.weight

    def norm(heads: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps) * weight

    q_heads = norm(q_ref.view(tokens, config.num_heads, -1), norm_weight[0])
    k_heads = norm(k_ref.view(tokens, config.num_kv_heads, -1), norm_weight[config.num_heads])
    angles = torch.arange(tokens)[:, None].float() * rope_inverse_frequencies(config)[None, :]
    cos, sin = angles.cos().repeat(1, 2)[:, None], angles.sin().repeat(1, 2)[:, None]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    torch.testing.assert_close(q, rotate(q_heads).flatten(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k, rotate(k_heads).flatten(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v, v_ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 2**-7)])
def test_rotary_matches_rotate_half(dtype: torch.dtype, tolerance: float) -> None:
    config = model_config_from_preset("tiny-llama-random")
    table = rotary_cos_sin_table(config, dtype, "cpu")
    positions = torch.tensor([0, 1, 7, 100, 4095])
    heads = torch.randn(len(positions), 3, config.head_dim).to(dtype)
    # Angles rounded to float32 as the table's are (at position 4095 that alone moves cos by ~1e-4).
    angles = (positions[:, None].float() * rope_inverse_frequencies(config)[None, :]).double()
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]
    half = config.head_dim // 2
    exact = heads.double()
    rotate_half = torch.cat((-exact[..., half:], exact[..., :half]), dim=-1)
    rotated = apply_rotary(heads, table[positions])
    assert rotated.dtype == dtype and rotated.is_contiguous()
    torch.testing.assert_close(rotated.double(), exact * cos + rotate_half * sin, rtol=tolerance, atol=tolerance)


def test_llama3_scaling_divides_low_frequencies_and_keeps_high_ones() -> None:
    base = model_config_from_preset("tiny-llama-random").with_overrides(head_dim=64, num_heads=1, num_kv_heads=1)
    scaled = base.with_overrides(rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 1024))
    plain, llama3 = rope_inverse_frequencies(base), rope_inverse_frequencies(scaled)
    wavelengths = 2 * torch.pi / plain
    short, long = wavelengths < 1024 / 4, wavelengths > 1024 / 1
    assert short.any() and long.any() and (~short & ~long).any()
    assert torch.equal(llama3[short], plain[short])
    torch.testing.assert_close(llama3[long], plain[long] / 8)
    medium = ~short & ~long
    assert ((llama3[medium] < plain[medium]) & (llama3[medium] > plain[medium] / 8)).all()
    linear = base.with_overrides(rope_scaling=RopeScaling("linear", 4.0))
    torch.testing.assert_close(rope_inverse_frequencies(linear), plain / 4)


class _CachedAttention:
    """A minimal KV-cached attend for one sequence: appends this step's k/v, attends causally over all so far."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def __call__(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        past = self.keys.get(layer_id, k[:0])
        self.keys[layer_id] = keys = torch.cat((past, k))
        self.values[layer_id] = values = torch.cat((self.values.get(layer_id, v[:0]), v))
        config, start, tokens = self.config, past.shape[0], q.shape[0]
        heads = q.reshape(tokens, config.num_heads, -1).transpose(0, 1)
        group = config.num_heads // config.num_kv_heads
        key_heads = keys.reshape(len(keys), config.num_kv_heads, -1).transpose(0, 1).repeat_interleave(group, 0)
        value_heads = values.reshape(len(keys), config.num_kv_heads, -1).transpose(0, 1).repeat_interleave(group, 0)
        scores = heads @ key_heads.transpose(1, 2) * config.attention_scale
        visible = torch.arange(len(keys))[None, :] <= torch.arange(start, start + tokens)[:, None]
        probabilities = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        return (probabilities @ value_heads).transpose(0, 1).reshape(tokens, -1)


@pytest.mark.parametrize("preset", ["tiny-qwen3-random", "tiny-llama-random"])
def test_prefill_then_decode_through_a_cache_matches_full_recompute(preset: str) -> None:
    model = random_model(model_config_from_preset(preset), seed=5)
    new_tokens = 6
    expected = reference_greedy(model, PROMPT, new_tokens)
    attend = _CachedAttention(model.config)
    with torch.inference_mode():
        hidden = model(torch.tensor(PROMPT), torch.arange(len(PROMPT)), attend)
        tokens = [int(model.compute_logits(hidden[-1:]).argmax())]
        for step in range(new_tokens - 1):
            position = torch.tensor([len(PROMPT) + step])
            hidden = model(torch.tensor(tokens[-1:]), position, attend)
            tokens.append(int(model.compute_logits(hidden).argmax()))
    assert tokens == expected


def test_dense_causal_attention_is_causal_and_grouped() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(5, 4 * 8), torch.randn(5, 2 * 8), torch.randn(5, 2 * 8)
    out = dense_causal_attention(q, k, v, num_heads=4, num_kv_heads=2, scale=8**-0.5)
    assert out.shape == (5, 32)
    # Token 0 sees only itself: its output is its own value for every head of the group.
    torch.testing.assert_close(out[0, :8], v[0, :8])
    torch.testing.assert_close(out[0, 8:16], v[0, :8])
    torch.testing.assert_close(out[0, 16:24], v[0, 8:])
    # Changing a later token never changes an earlier output.
    v2 = v.clone()
    v2[4] += 1
    out2 = dense_causal_attention(q, k, v2, num_heads=4, num_kv_heads=2, scale=8**-0.5)
    assert torch.equal(out[:4], out2[:4]) and not torch.equal(out[4], out2[4])


def test_tied_head_is_the_embedding_and_parameters_need_no_grad() -> None:
    model = random_model(model_config_from_preset("tiny-qwen3-random"))
    assert model.lm_head is model.embed_tokens
    untied = CausalLM(model_config_from_preset("tiny-llama-random"))
    assert untied.lm_head is not untied.embed_tokens
    assert not any(parameter.requires_grad for parameter in untied.parameters())
