"""Saving and loading Hugging Face directories: round trips, shards, dtypes and every checkpoint error."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from cudagraph.engine.model import (
    CausalLM,
    ModelFileNotFoundError,
    ModelLoadError,
    load_model,
    model_config_from_preset,
    random_model,
    reference_logits,
    save_model,
)

PROMPT = [5, 17, 300, 2, 99, 411, 7, 7, 60]


def _tensor_names(directory: Path) -> set[str]:
    names: set[str] = set()
    for file in directory.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as checkpoint:
            names.update(checkpoint.keys())
    return names


@pytest.mark.parametrize("preset", ["tiny-qwen3-random", "tiny-llama-random"])
def test_round_trip_is_bitwise_in_float32(tmp_path: Path, preset: str) -> None:
    model = random_model(model_config_from_preset(preset), seed=3)
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.dtype == torch.float32 and loaded.config == model.config
    assert torch.equal(reference_logits(loaded, PROMPT), reference_logits(model, PROMPT))
    for (name, ours), (_, theirs) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(ours, theirs), name


def test_saved_names_are_hugging_face_names(tmp_path: Path) -> None:
    config = model_config_from_preset("tiny-qwen3-random")
    save_model(random_model(config), tmp_path)
    names = _tensor_names(tmp_path)
    assert "lm_head.weight" not in names  # tied: the head is the embedding
    for layer in range(config.num_layers):
        for part in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
            assert f"model.layers.{layer}.self_attn.{part}.weight" in names
        for part in ("gate_proj", "up_proj", "down_proj"):
            assert f"model.layers.{layer}.mlp.{part}.weight" in names
    assert {"model.embed_tokens.weight", "model.norm.weight"} <= names
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (config.kv_size, config.hidden_size)
    assert tensors["model.layers.1.self_attn.q_norm.weight"].shape == (config.head_dim,)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]


def test_untied_and_biased_models_save_head_and_biases(tmp_path: Path) -> None:
    config = model_config_from_preset("tiny-llama-random").with_overrides(model_type="qwen2")
    model = random_model(config, seed=1)
    save_model(model, tmp_path)
    names = _tensor_names(tmp_path)
    assert "lm_head.weight" in names and "model.layers.0.self_attn.q_proj.bias" in names
    assert "model.layers.0.self_attn.o_proj.bias" not in names
    assert torch.equal(reference_logits(load_model(tmp_path), PROMPT), reference_logits(model, PROMPT))


def test_sharded_checkpoint_loads_the_same_model(tmp_path: Path) -> None:
    model = random_model(model_config_from_preset("tiny-llama-random"), seed=2)
    save_model(model, tmp_path, max_shard_bytes=40_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shard_files = sorted(set(index["weight_map"].values()))
    assert len(shard_files) > 3 and not (tmp_path / "model.safetensors").exists()
    assert shard_files[0] == f"model-00001-of-{len(shard_files):05d}.safetensors"
    loaded = load_model(tmp_path, progress=True)
    assert torch.equal(reference_logits(loaded, PROMPT), reference_logits(model, PROMPT))


def test_float32_checkpoint_stays_float32_and_dtype_overrides(tmp_path: Path) -> None:
    model = random_model(model_config_from_preset("tiny-qwen3-random"))
    save_model(model, tmp_path)
    assert load_model(tmp_path, "auto").embed_tokens.dtype == torch.float32
    as_bf16 = load_model(tmp_path, dtype="bfloat16")
    assert {p.dtype for p in as_bf16.parameters()} == {torch.bfloat16}
    assert as_bf16.rotary_cos_sin.dtype == torch.bfloat16
    assert torch.equal(as_bf16.embed_tokens, model.embed_tokens.to(torch.bfloat16))
    assert load_model(tmp_path, dtype=torch.float16).dtype == torch.float16


def test_auto_keeps_a_bfloat16_checkpoint_in_bfloat16(tmp_path: Path) -> None:
    model = random_model(model_config_from_preset("tiny-llama-random"), dtype="bfloat16")
    save_model(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    loaded = load_model(tmp_path)
    assert loaded.dtype == torch.bfloat16 and loaded.config.torch_dtype == "bfloat16"
    assert torch.equal(load_model(tmp_path, "float32").lm_head, model.lm_head.float())


def test_unsupported_dtype_is_an_error(tmp_path: Path) -> None:
    save_model(random_model(model_config_from_preset("tiny-llama-random")), tmp_path)
    with pytest.raises(ModelLoadError, match="unsupported dtype 'int8': use 'auto' or one of float32, bfloat16"):
        load_model(tmp_path, dtype="int8")
    with pytest.raises(ModelLoadError, match=r"unsupported dtype torch\.float64"):
        CausalLM(model_config_from_preset("tiny-llama-random"), torch.float64)


def test_missing_config_or_weights_name_what_is_expected(tmp_path: Path) -> None:
    with pytest.raises(ModelFileNotFoundError, match=r"no config\.json"):
        load_model(tmp_path)
    save_model(random_model(model_config_from_preset("tiny-llama-random")), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ModelFileNotFoundError, match=r"expected model\.safetensors or model\.safetensors\.index\.json"):
        load_model(tmp_path)


def test_missing_shard_is_named(tmp_path: Path) -> None:
    save_model(random_model(model_config_from_preset("tiny-llama-random")), tmp_path, max_shard_bytes=40_000)
    (second_shard,) = tmp_path.glob("model-00002-of-*.safetensors")
    second_shard.unlink()
    with pytest.raises(ModelFileNotFoundError, match=r"names shard model-00002-of-\d+\.safetensors, which is missing"):
        load_model(tmp_path)


def _rewrite(directory: Path, edit: Callable[[dict[str, torch.Tensor]], object]) -> None:
    tensors = load_file(str(directory / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})


def test_missing_tensor_is_named_with_its_expected_shape(tmp_path: Path) -> None:
    save_model(random_model(model_config_from_preset("tiny-qwen3-random")), tmp_path)
    _rewrite(tmp_path, lambda tensors: tensors.pop("model.layers.1.self_attn.k_norm.weight"))
    with pytest.raises(ModelLoadError, match=r"missing tensor 'model.layers.1.self_attn.k_norm.weight'.*shape \(32,\)"):
        load_model(tmp_path)


def test_untied_checkpoint_without_head_is_an_error(tmp_path: Path) -> None:
    save_model(random_model(model_config_from_preset("tiny-llama-random")), tmp_path)
    _rewrite(tmp_path, lambda tensors: tensors.pop("lm_head.weight"))
    with pytest.raises(ModelLoadError, match=r"missing tensor 'lm_head.weight'.*shape \(512, 64\)"):
        load_model(tmp_path)


def test_wrongly_shaped_tensor_is_named_with_both_shapes(tmp_path: Path) -> None:
    save_model(random_model(model_config_from_preset("tiny-llama-random")), tmp_path)

    def transpose(tensors: dict[str, torch.Tensor]) -> None:
        tensors["model.layers.0.mlp.up_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"].T.contiguous()

    _rewrite(tmp_path, transpose)
    with pytest.raises(
        ModelLoadError,
        match=r"'model.layers.0.mlp.up_proj.weight' in model.safetensors has shape \(64, 160\), but config.json "
        r"implies \(160, 64\)",
    ):
        load_model(tmp_path)


def test_extra_tensors_are_ignored_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = random_model(model_config_from_preset("tiny-qwen3-random"))
    save_model(model, tmp_path)

    def add_extras(tensors: dict[str, torch.Tensor]) -> None:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()  # tied checkpoints may carry it
        tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(16)
        tensors["model.vision_tower.weight"] = torch.ones(3)

    _rewrite(tmp_path, add_extras)
    loaded = load_model(tmp_path)
    assert torch.equal(reference_logits(loaded, PROMPT), reference_logits(model, PROMPT))
    assert "ignoring 1 tensors the model does not use, e.g. ['model.vision_tower.weight']" in caplog.text
