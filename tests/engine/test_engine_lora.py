"""LoRA adapters in the reference engine against merged weights: every request of a batch mixing adapters (and no
adapter) gets the greedy tokens of a model whose weights have its adapter merged in (``W + scaling * B @ A``),
eagerly and replayed from the CPU doubles of both graph variants; loading another adapter into a slot in place
replays the same graphs with the new adapter; bad adapters and settings are clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lora_helpers import LORA, TARGETS, base_model, engine, greedy, merged, prompts, random_adapter
from safetensors.torch import save_file

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.config import Backend, Phase
from cudagraph.engine.batch import Request, SamplingParams
from cudagraph.engine.generate import Scheduler, StepPolicy
from cudagraph.engine.lora import LoraAdapter, LoraConfig, LoraError
from cudagraph.engine.model_runner import ModelRunner
from cudagraph.engine.speculative import NgramDrafter

NAMES = ("a", "b", None, "a", None, "b")
"""Six requests: two through each adapter, two through none."""


@pytest.fixture(scope="module")
def model():
    return base_model()


@pytest.fixture(scope="module")
def adapters(model):
    """Adapter ``a`` at the slots' full rank, ``b`` at a smaller one (padded with zeros in its slot)."""
    return {"a": random_adapter(model, rank=8, seed=11), "b": random_adapter(model, rank=4, seed=12, alpha=2.0)}


@pytest.fixture(scope="module")
def expected(model, adapters):
    """Each request's greedy tokens from an engine without LoRA over its adapter's merged weights."""
    prompt_list = prompts(len(NAMES))
    tokens = []
    for prompt, name in zip(prompt_list, NAMES, strict=True):
        reference = engine(merged(model, adapters.get(name) if name else None), lora=None)
        tokens.append(greedy(reference, [prompt], [None])[0])
    return prompt_list, tokens


def lora_engine(model, adapters) -> ModelRunner:
    model_runner = engine(model)
    for name, adapter in adapters.items():
        model_runner.load_lora_adapter(name, adapter)
    return model_runner


def capture_both_variants(model_runner: ModelRunner) -> None:
    """Decode (full) and prefill (breakable) graphs of both variants, on the CPU replay doubles."""
    for lora in (False, True):
        model_runner.capture_cuda_graph_variant(Phase.DECODE, lora=lora, backend=CpuReplayBackend(Backend.FULL))
        model_runner.capture_cuda_graph_variant(Phase.PREFILL, lora=lora, backend=CpuReplayBackend(Backend.BREAKABLE))


def test_a_batch_mixing_adapters_gives_each_request_its_merged_weights_tokens(model, adapters, expected) -> None:
    prompt_list, want = expected
    got = greedy(lora_engine(model, adapters), prompt_list, NAMES)
    assert got == want
    base = greedy(engine(model, lora=None), prompt_list, [None] * len(NAMES))
    # The adapters do change the tokens (else the comparison above would prove nothing about them).
    assert all(got[i] != base[i] for i, name in enumerate(NAMES) if name is not None)
    assert all(got[i] == base[i] for i, name in enumerate(NAMES) if name is None)


def test_both_graph_variants_replay_their_steps_with_the_merged_weights_tokens(model, adapters, expected) -> None:
    prompt_list, want = expected
    model_runner = lora_engine(model, adapters)
    capture_both_variants(model_runner)
    assert greedy(model_runner, prompt_list, NAMES) == want
    replays = model_runner.cuda_graph_variant_replays
    assert replays["decode lora"] > 0 and replays["prefill lora"] > 0
    assert replays["decode"] == replays["prefill"] == 0  # every step of that batch had an adapter
    plain = [i for i, name in enumerate(NAMES) if name is None]
    assert greedy(model_runner, [prompt_list[i] for i in plain], [None] * len(plain)) == [want[i] for i in plain]
    after = model_runner.cuda_graph_variant_replays
    assert after["decode"] > 0 and after["prefill"] > 0
    assert after["decode lora"] == replays["decode lora"]
    assert model_runner.lora_cuda_graph_metrics[Phase.DECODE].eager == 0


def test_an_adapter_loaded_in_place_replays_without_recapture(model, adapters) -> None:
    model_runner = lora_engine(model, adapters)
    capture_both_variants(model_runner)
    prompt_list = prompts(3, seed=4)
    names = ["a", None, "a"]
    greedy(model_runner, prompt_list, names)
    runner = model_runner.lora_decode_cuda_graph_runner
    assert runner is not None
    buckets, replays = runner.captured_buckets, runner.metrics.replays
    addresses = {name: t.data_ptr() for name, t in model_runner.graph_read_tensors().items()}

    replacement = random_adapter(model, rank=6, seed=99)
    assert model_runner.load_lora_adapter("a", replacement) == model_runner.lora.slot_of["a"]
    got = greedy(model_runner, prompt_list, names)

    assert runner.captured_buckets == buckets and runner.metrics.replays > replays
    assert runner.refresh_graphs(on_moved="raise") == ()  # every tensor a graph reads is where it was
    assert {name: t.data_ptr() for name, t in model_runner.graph_read_tensors().items()} == addresses
    for prompt, name, tokens in zip(prompt_list, names, got, strict=True):
        reference = engine(merged(model, replacement if name else None), lora=None)
        assert tokens == greedy(reference, [prompt], [None])[0]


def test_sleep_and_wake_capture_the_lora_variant_again_with_the_adapters_applied(model, adapters, expected) -> None:
    prompt_list, want = expected
    model_runner = lora_engine(model, adapters)
    capture_both_variants(model_runner)
    runner = model_runner.lora_decode_cuda_graph_runner
    assert runner is not None
    model_runner.sleep()
    assert runner.captured_buckets == ()
    model_runner.wake()
    assert runner.captured_buckets == (1, 2, 4, 8)
    replays = runner.metrics.replays
    assert greedy(model_runner, prompt_list, NAMES) == want
    assert runner.metrics.replays > replays


def test_speculative_verify_steps_apply_each_requests_adapter(model, adapters, expected) -> None:
    prompt_list, want = expected
    model_runner = lora_engine(model, adapters)
    params = [SamplingParams(max_new_tokens=8, lora_name=name) for name in NAMES]
    scheduler = Scheduler(model_runner, policy=StepPolicy(drafter=NgramDrafter(num_tokens=2)))
    got = [output.output_token_ids for output in scheduler.run(prompt_list, params)]
    assert got == want
    assert scheduler.stats.verify_steps > 0 and scheduler.stats.decode_steps == 0


def test_unloading_an_adapter_gives_its_slot_the_base_model(model, adapters) -> None:
    model_runner = lora_engine(model, adapters)
    slot = model_runner.lora.slot_of["b"]
    model_runner.unload_lora_adapter("b")
    assert model_runner.lora.slots.a(0, "q_proj")[slot].abs().sum() == 0
    assert model_runner.load_lora_adapter("c", adapters["b"]) == slot  # the freed slot is taken again
    prompt_list = prompts(2, seed=8)
    assert greedy(model_runner, prompt_list, ["c", None]) == [
        greedy(engine(merged(model, adapters["b"]), lora=None), prompt_list[:1], [None])[0],
        greedy(engine(model, lora=None), prompt_list[1:], [None])[0],
    ]


def save_peft(adapter: LoraAdapter, directory: Path, alpha: float, rslora: bool = False) -> Path:
    """``adapter`` written as PEFT writes one."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {"r": adapter.rank, "lora_alpha": alpha, "target_modules": sorted(adapter.target_modules)}
    if rslora:
        config["use_rslora"] = True
    (directory / "adapter_config.json").write_text(json.dumps(config))
    tensors = {}
    for (layer, module), factors in adapter.factors.items():
        prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
        tensors[f"{prefix}.lora_A.weight"] = factors.a.contiguous()
        tensors[f"{prefix}.lora_B.weight"] = factors.b.contiguous()
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    return directory


def test_a_peft_directory_loads_the_same_adapter(model, adapters, tmp_path) -> None:
    adapter = adapters["a"]
    alpha = adapter.scaling * adapter.rank
    read = LoraAdapter.from_peft(save_peft(adapter, tmp_path / "a", alpha))
    assert read.rank == adapter.rank and read.scaling == pytest.approx(adapter.scaling)
    assert read.factors.keys() == adapter.factors.keys()
    rslora = LoraAdapter.from_peft(save_peft(adapter, tmp_path / "rs", alpha, rslora=True))
    assert rslora.scaling == pytest.approx(alpha / adapter.rank**0.5)
    model_runner = engine(model)
    model_runner.load_lora_adapter("a", tmp_path / "a")
    prompt_list = prompts(1, seed=5)
    want = greedy(engine(merged(model, adapter), lora=None), prompt_list, [None])
    assert greedy(model_runner, prompt_list, ["a"]) == want


def test_an_adapter_on_fewer_targets_adds_only_to_those(model) -> None:
    adapter = random_adapter(model, rank=4, seed=21, targets=("v_proj", "o_proj"))
    model_runner = engine(model, LoraConfig(max_loras=1, max_rank=4, target_modules=("v", "o")))
    model_runner.load_lora_adapter("vo", adapter)
    prompt_list = prompts(2, seed=6)
    want = [greedy(engine(merged(model, adapter), lora=None), prompt_list[:1], [None])[0]]
    want.append(greedy(engine(model, lora=None), prompt_list[1:], [None])[0])
    assert greedy(model_runner, prompt_list, ["vo", None]) == want


# -- errors -----------------------------------------------------------------------------------------------------------


def test_an_adapter_above_max_rank_is_refused(model) -> None:
    model_runner = engine(model)
    with pytest.raises(LoraError, match=r"rank 9 exceeds LoraConfig\.max_rank=8"):
        model_runner.load_lora_adapter("big", random_adapter(model, rank=9, seed=1))
    assert model_runner.lora.slot_of == {}


def test_unknown_target_modules_are_refused(model, tmp_path) -> None:
    with pytest.raises(LoraError, match=r"unknown LoRA target module 'gate_proj'.*q_proj, k_proj, v_proj, o_proj"):
        LoraConfig(target_modules=("q", "gate_proj"))
    adapter = random_adapter(model, rank=2, seed=1, targets=("q_proj",))
    directory = save_peft(adapter, tmp_path / "mlp", alpha=2)
    tensors = {"base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight": torch.zeros(2, 64)}
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    with pytest.raises(LoraError, match="unknown LoRA target module 'gate_proj'"):
        LoraAdapter.from_peft(directory)


def test_a_target_outside_the_config_is_refused(model) -> None:
    model_runner = engine(model, LoraConfig(max_loras=1, max_rank=4, target_modules=("q",)))
    with pytest.raises(LoraError, match=r"target 'o_proj' is not configured: LoraConfig\.target_modules is q_proj"):
        model_runner.load_lora_adapter("o", random_adapter(model, rank=2, seed=1, targets=("o_proj",)))


def test_no_free_slot_is_an_error_naming_the_loaded_adapters(model, adapters) -> None:
    model_runner = engine(model, LoraConfig(max_loras=2, max_rank=8))
    model_runner.load_lora_adapter("a", adapters["a"])
    model_runner.load_lora_adapter("b", adapters["b"])
    with pytest.raises(LoraError, match="no free LoRA slot for 'c': all 2 hold a, b"):
        model_runner.load_lora_adapter("c", adapters["a"])
    model_runner.load_lora_adapter("a", adapters["b"])  # a loaded name is replaced in its own slot


def test_factors_of_the_wrong_shape_are_refused(model) -> None:
    wrong = LoraAdapter.from_tensors({(0, "q"): (torch.zeros(2, 32), torch.zeros(64, 2))})
    with pytest.raises(LoraError, match=r"layer 0 q_proj have shapes A \(2, 32\), B \(64, 2\); this model needs A "):
        engine(model).load_lora_adapter("w", wrong)
    with pytest.raises(LoraError, match=r"expected A \[rank, in\] and B \[out, rank\] with the adapter's rank 2"):
        LoraAdapter.from_tensors({(0, "q"): (torch.zeros(2, 64), torch.zeros(64, 3))})
    with pytest.raises(LoraError, match=r"one rank; got ranks \[2, 3\]"):
        LoraAdapter.from_tensors(
            {(0, "q"): (torch.zeros(2, 64), torch.zeros(64, 2)), (0, "k"): (torch.zeros(3, 64), torch.zeros(16, 3))}
        )


def test_a_request_naming_an_unloaded_adapter_is_refused_before_it_takes_cache(model) -> None:
    model_runner = engine(model)
    with pytest.raises(LoraError, match="LoRA adapter 'nope' is not loaded \\(loaded: none\\)"):
        model_runner.hold(Request(0, [1, 2, 3], SamplingParams(lora_name="nope")))
    assert model_runner.req_to_token_pool.available == engine(model).req_to_token_pool.available
    without = engine(model, lora=None)
    with pytest.raises(LoraError, match="serves no LoRA adapters"):
        without.hold(Request(0, [1, 2, 3], SamplingParams(lora_name="a")))


def test_lora_settings_are_checked() -> None:
    with pytest.raises(LoraError, match="max_rank must be a whole number, at least 1"):
        LoraConfig(max_rank=0)
    with pytest.raises(LoraError, match="max_loras"):
        LoraConfig(max_loras=True)
    assert LoraConfig(target_modules=("o", "q")).target_modules == ("q_proj", "o_proj")
    assert LORA.target_modules == TARGETS
