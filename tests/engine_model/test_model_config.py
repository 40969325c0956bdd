"""ModelConfig parsing for each supported family (both Transformers spellings) and every config error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from published import published_config

from cudagraph.engine.model import (
    PRESETS,
    ModelConfig,
    ModelFileNotFoundError,
    ModelLoadError,
    RopeScaling,
    model_config_from_preset,
)

# Trimmed from the published config.json of each family (Transformers 4 spelling).
QWEN3_0_6B = published_config("qwen3-0.6b")
LLAMA_3_2_1B = published_config("llama-3.2-1b")
QWEN2_5_0_5B = published_config("qwen2.5-0.5b")


def test_qwen3_config_has_explicit_head_dim_qk_norm_and_no_bias() -> None:
    config = ModelConfig.from_hf_dict(QWEN3_0_6B)
    assert (config.model_type, config.hidden_size, config.num_layers) == ("qwen3", 1024, 28)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (16, 8, 128)
    assert config.q_size == 2048 and config.kv_size == 1024
    assert config.qk_norm and not config.qkv_bias and not config.o_bias
    assert config.tie_word_embeddings and config.torch_dtype == "bfloat16"
    assert config.rope_theta == 1e6 and config.rope_scaling is None
    assert config.eos_token_ids == (151645,) and config.bos_token_id == 151643
    assert config == model_config_from_preset("qwen3-0.6b-random").with_overrides(
        bos_token_id=151643, eos_token_ids=(151645,)
    )


def test_llama_config_reads_llama3_rope_scaling_and_eos_list() -> None:
    config = ModelConfig.from_hf_dict(LLAMA_3_2_1B)
    assert config.model_type == "llama" and config.architecture == "LlamaForCausalLM"
    assert config.head_dim == 64 and not config.qk_norm and not config.qkv_bias
    assert config.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)
    assert config.eos_token_ids == (128001, 128008, 128009)
    assert config.rms_norm_eps == 1e-5


def test_qwen2_config_always_has_qkv_bias_but_no_output_bias() -> None:
    config = ModelConfig.from_hf_dict(QWEN2_5_0_5B)
    assert config.model_type == "qwen2"
    assert config.head_dim == 64  # hidden_size / heads: Qwen2 has no head_dim key
    assert config.qkv_bias and not config.o_bias and not config.qk_norm


def test_llama_attention_bias_covers_output_projection() -> None:
    config = ModelConfig.from_hf_dict({**LLAMA_3_2_1B, "attention_bias": True})
    assert config.qkv_bias and config.o_bias


def test_defaults_when_optional_keys_are_absent() -> None:
    minimal = {
        key: LLAMA_3_2_1B[key]
        for key in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    }
    config = ModelConfig.from_hf_dict({**minimal, "vocab_size": 100})
    assert config.num_kv_heads == config.num_heads == 32
    assert config.head_dim == 2048 // 32
    assert config.max_position_embeddings == 2048 and config.rope_theta == 10000.0
    assert config.torch_dtype == "float32" and not config.tie_word_embeddings


def test_architecture_is_found_from_architectures_when_model_type_is_missing() -> None:
    raw = {key: value for key, value in QWEN3_0_6B.items() if key != "model_type"}
    assert ModelConfig.from_hf_dict(raw).model_type == "qwen3"


def test_transformers_5_spelling_rope_parameters_and_dtype() -> None:
    raw = {
        key: value for key, value in LLAMA_3_2_1B.items() if key not in ("rope_scaling", "rope_theta", "torch_dtype")
    }
    raw["rope_parameters"] = {**LLAMA_3_2_1B["rope_scaling"], "rope_theta": 250000.0}
    raw["dtype"] = "float16"
    config = ModelConfig.from_hf_dict(raw)
    assert config.rope_theta == 250000.0 and config.torch_dtype == "float16"
    assert config.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)
    default_rope = {**raw, "rope_parameters": {"rope_type": "default", "rope_theta": 10.0}}
    assert ModelConfig.from_hf_dict(default_rope).rope_scaling is None


def test_linear_rope_scaling_and_legacy_type_key() -> None:
    config = ModelConfig.from_hf_dict({**LLAMA_3_2_1B, "rope_scaling": {"type": "linear", "factor": 2}})
    assert config.rope_scaling == RopeScaling("linear", 2.0)


@pytest.mark.parametrize("raw", [QWEN3_0_6B, LLAMA_3_2_1B, QWEN2_5_0_5B, {**LLAMA_3_2_1B, "attention_bias": True}])
def test_to_hf_dict_round_trips(raw: dict[str, Any]) -> None:
    config = ModelConfig.from_hf_dict(raw)
    written = json.loads(json.dumps(config.to_hf_dict()))
    assert ModelConfig.from_hf_dict(written) == config
    # Transformers 4 reads rope_theta/rope_scaling, 5 reads rope_parameters: both must say the same.
    assert written["rope_parameters"]["rope_theta"] == written["rope_theta"] == config.rope_theta
    assert written["architectures"] == [config.architecture]


def test_from_pretrained_reads_a_directory_or_the_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_0_6B))
    assert ModelConfig.from_pretrained(tmp_path) == ModelConfig.from_pretrained(tmp_path / "config.json")


def test_missing_config_json_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ModelFileNotFoundError, match=r"no config\.json at .*config\.json"):
        ModelConfig.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError):  # also a FileNotFoundError for callers that catch that
        ModelConfig.from_pretrained(tmp_path / "nowhere")


def test_a_file_that_is_not_json_is_not_a_model_directory(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("some notes\n")
    with pytest.raises(
        ModelLoadError, match=r"notes\.txt is not a model directory: give a folder holding config\.json"
    ):
        ModelConfig.from_pretrained(notes)


def test_invalid_json_is_a_load_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        ModelConfig.from_pretrained(tmp_path)


CONFIG_ERRORS = [
    pytest.param(
        {**QWEN3_0_6B, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]},
        r"unsupported architecture \(model_type='gpt2', architectures=\['GPT2LMHeadModel'\]\): supported are llama "
        r"\(LlamaForCausalLM\), qwen2 \(Qwen2ForCausalLM\), qwen3 \(Qwen3ForCausalLM\), "
        r"qwen3_moe \(Qwen3MoeForCausalLM\), mixtral \(MixtralForCausalLM\)",
        id="architecture",
    ),
    pytest.param({**QWEN3_0_6B, "hidden_size": None}, "missing required key 'hidden_size'", id="missing-key"),
    pytest.param({**QWEN3_0_6B, "num_hidden_layers": "28"}, "'num_hidden_layers' must be int, got '28'", id="type"),
    pytest.param({**QWEN3_0_6B, "tie_word_embeddings": 1}, "'tie_word_embeddings' must be bool", id="bool-type"),
    pytest.param({**QWEN3_0_6B, "hidden_act": "gelu"}, "hidden_act 'gelu' is not supported: only 'silu'", id="act"),
    pytest.param({**LLAMA_3_2_1B, "mlp_bias": True}, "mlp_bias=true is not supported", id="mlp-bias"),
    pytest.param({**QWEN2_5_0_5B, "use_sliding_window": True}, "use_sliding_window=true is not supported", id="swa"),
    pytest.param(
        {**LLAMA_3_2_1B, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
        "rope scaling type 'yarn' is not supported: supported are default, linear, llama3",
        id="rope-type",
    ),
    pytest.param(
        {**LLAMA_3_2_1B, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
        "llama3 rope scaling needs a number 'low_freq_factor'",
        id="rope-field",
    ),
    pytest.param(
        {**QWEN3_0_6B, "torch_dtype": "int8"},
        "dtype 'int8' is not supported: supported are float32, bfloat16, float16",
        id="dtype",
    ),
    pytest.param(
        {**QWEN3_0_6B, "num_key_value_heads": 5},
        r"num_attention_heads \(16\) must be a multiple of num_key_value_heads \(5\)",
        id="gqa",
    ),
    pytest.param(
        {**QWEN2_5_0_5B, "num_attention_heads": 15},
        r"hidden_size \(896\) is not divisible by num_attention_heads \(15\) and no head_dim is given",
        id="head-dim",
    ),
    pytest.param({**QWEN3_0_6B, "eos_token_id": "x"}, "'eos_token_id' must be an integer", id="eos"),
    pytest.param({**QWEN3_0_6B, "intermediate_size": 0}, "intermediate_size must be a positive integer", id="zero"),
]


@pytest.mark.parametrize(("raw", "message"), CONFIG_ERRORS)
def test_config_errors_say_what_is_wrong_and_what_is_allowed(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelLoadError, match=message) as error:
        ModelConfig.from_hf_dict(raw, source="m/config.json")
    assert "\n" not in str(error.value)


def test_presets_and_unknown_preset() -> None:
    assert set(PRESETS) >= {"qwen3-0.6b-random", "tiny-qwen3-random", "tiny-llama-random"}
    assert model_config_from_preset("tiny-llama-random").model_type == "llama"
    assert model_config_from_preset("tiny-qwen3-random").qk_norm
    known = r"known presets are llama3-70b-random, llama3-8b-random, llama3\.2-1b-random, qwen3-0\.6b-random, "
    with pytest.raises(ModelLoadError, match=r"unknown model preset 'nope': " + known):
        model_config_from_preset("nope")
