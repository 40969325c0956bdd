"""The expert fields in ``ModelConfig`` (Qwen3-MoE, Mixtral): read from published config.json files (and
Transformers 5's spelling), written back, which layers route to experts, the presets, and one clear error for each
bad value."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from published import published_config

from cudagraph.engine.model import (
    ModelConfig,
    ModelLoadError,
    RowRange,
    ShardPlan,
    TensorParallelError,
    model_config_from_preset,
)

# Trimmed from Qwen3-30B-A3B's published config.json (Transformers 4 spelling).
QWEN3_30B_A3B = published_config("qwen3-30b-a3b")


def test_the_published_config_is_the_preset_shape() -> None:
    config = ModelConfig.from_hf_dict(QWEN3_30B_A3B)
    assert config.architecture == "Qwen3MoeForCausalLM" and config.qk_norm and not config.qkv_bias
    preset = model_config_from_preset("qwen3-30b-a3b-random")
    assert config.with_overrides(bos_token_id=None, eos_token_ids=()) == preset
    assert all(config.uses_experts(layer) for layer in range(48)) and config.has_experts


def test_expert_fields_round_trip_and_transformers_5_spelling_is_read() -> None:
    config = ModelConfig.from_hf_dict({**QWEN3_30B_A3B, "mlp_only_layers": [0, 47], "norm_topk_prob": False})
    written = config.to_hf_dict()
    assert written["num_experts"] == 128 and written["mlp_only_layers"] == [0, 47]
    assert ModelConfig.from_hf_dict(written) == config
    renamed = {key: value for key, value in QWEN3_30B_A3B.items() if key != "num_experts"}
    assert ModelConfig.from_hf_dict({**renamed, "num_local_experts": 64}).num_experts == 64


def test_dense_families_write_no_expert_fields() -> None:
    written = model_config_from_preset("tiny-qwen3-random").to_hf_dict()
    assert not {"num_experts", "moe_intermediate_size", "mlp_only_layers"} & set(written)


@given(
    layers=st.integers(1, 12),
    step=st.integers(1, 4),
    dense=st.sets(st.integers(0, 11), max_size=4),
)
def test_a_layer_routes_to_experts_by_step_unless_listed_dense(layers: int, step: int, dense: set[int]) -> None:
    only_mlp = tuple(sorted(layer for layer in dense if layer < layers))
    config = model_config_from_preset("tiny-qwen3-moe-random").with_overrides(
        num_layers=layers, decoder_sparse_step=step, mlp_only_layers=only_mlp
    )
    sparse = [layer for layer in range(layers) if config.uses_experts(layer)]
    assert sparse == [layer for layer in range(step - 1, layers, step) if layer not in only_mlp]


MOE_ERRORS = [
    pytest.param({"num_experts": None}, "missing required key 'num_experts'", id="missing"),
    pytest.param({"num_experts": 0}, "num_experts and moe_intermediate_size must be positive", id="zero-experts"),
    pytest.param(
        {"num_experts_per_tok": 129}, r"num_experts_per_tok must be between 1 and num_experts \(128\)", id="k"
    ),
    pytest.param({"decoder_sparse_step": 0}, "decoder_sparse_step must be a positive integer", id="step"),
    pytest.param({"mlp_only_layers": [3, 48]}, r"names layers \[48\] outside 0..47", id="layer-range"),
    pytest.param({"mlp_only_layers": "0"}, "'mlp_only_layers' must be a list of integers", id="layer-type"),
    pytest.param({"norm_topk_prob": "yes"}, "'norm_topk_prob' must be bool", id="bool"),
]


@pytest.mark.parametrize(("changes", "message"), MOE_ERRORS)
def test_bad_expert_fields_are_one_clear_error(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelLoadError, match=message) as error:
        ModelConfig.from_hf_dict({**QWEN3_30B_A3B, **changes}, source="m/config.json")
    assert "\n" not in str(error.value)


def test_expert_fields_on_a_family_without_experts_are_refused() -> None:
    with pytest.raises(ModelLoadError, match=r"model_type 'qwen3' has no experts: .* only for qwen3_moe"):
        model_config_from_preset("tiny-qwen3-random").with_overrides(num_experts=8)


def test_a_tensor_parallel_size_must_split_the_experts_whole() -> None:
    config = model_config_from_preset("tiny-qwen3-moe-random").with_overrides(num_experts=6)
    ShardPlan(0, 2, "tp").check(config)
    with pytest.raises(TensorParallelError, match=r"must divide num_experts \(6\).*use one of 1, 2, 3, 6"):
        ShardPlan(0, 4, "tp").check(config.with_overrides(num_heads=4, num_kv_heads=2))
    assert [ShardPlan(rank, 2, "tp").experts(config) for rank in range(2)] == [RowRange(0, 3), RowRange(3, 6)]


# Trimmed from Mixtral-8x7B-v0.1's published config.json.
MIXTRAL_8X7B = published_config("mixtral-8x7b-v0.1")


def test_mixtral_routes_every_layer_to_experts_of_its_mlp_width() -> None:
    config = ModelConfig.from_hf_dict(MIXTRAL_8X7B)
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (8, 2, 14336)
    assert config.norm_topk_prob and not config.qk_norm and not config.qkv_bias and not config.o_bias
    assert all(config.uses_experts(layer) for layer in range(32))
    written = config.to_hf_dict()
    assert written["num_local_experts"] == 8 and written["sliding_window"] is None
    assert not {"num_experts", "moe_intermediate_size", "mlp_only_layers", "norm_topk_prob"} & set(written)
    assert ModelConfig.from_hf_dict(written) == config


MIXTRAL_ERRORS = [
    pytest.param({"sliding_window": 4096}, r"sliding_window=4096 is not supported: only full attention", id="window"),
    pytest.param({"num_local_experts": None}, "missing required key 'num_local_experts'", id="missing"),
]


@pytest.mark.parametrize(("changes", "message"), MIXTRAL_ERRORS)
def test_bad_mixtral_fields_are_one_clear_error(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        ModelConfig.from_hf_dict({**MIXTRAL_8X7B, **changes}, source="m/config.json")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"norm_topk_prob": False}, "mixtral routes on every layer with renormalized weights"),
        ({"mlp_only_layers": (0,)}, "mixtral routes on every layer with renormalized weights"),
    ],
)
def test_what_mixtral_fixes_cannot_be_changed(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        model_config_from_preset("tiny-mixtral-random").with_overrides(**changes)
