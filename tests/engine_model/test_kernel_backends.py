"""Choosing the kernel set: the registry's conditions, ``auto``'s fallbacks (and why it logs), one clear error for a
named set that cannot run, the tc_piecewise rule, and the fused set's plumbing through a CPU stand-in of FlashInfer
against the torch kernels."""

from __future__ import annotations

import importlib
import logging
import re
import sys

import fake_flashinfer
import pytest
import torch

from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig, resolve
from cudagraph.engine.kernels import (
    KERNEL_BACKEND_CHOICES,
    TORCH_KERNELS,
    KernelBackendError,
    KernelBackendUnavailableError,
    KernelTarget,
    select_kernels,
)
from cudagraph.engine.model import dense_attend, model_config_from_preset, random_model, reference_logits
from cudagraph.engine.model_runner import CacheConfig, ModelRunner

CUDA = torch.device("cuda")  # only described: selecting never touches the device until a set is built
QWEN3_0_6B = model_config_from_preset("qwen3-0.6b-random")
PROMPT = [3, 141, 59, 26, 5, 358, 97, 9]


Warmed = list[tuple[object, torch.dtype]]
"""The (config, dtype) of every fused set built, recorded by the stand-in warm-up."""


def target(**changes: object) -> KernelTarget:
    """A target every condition of the fused set holds for, with ``changes``."""
    fields: dict[str, object] = {"config": QWEN3_0_6B, "dtype": torch.bfloat16, "device": CUDA, "traced": False}
    fields.update(changes)
    return KernelTarget(**fields)  # type: ignore[arg-type]


@pytest.fixture
def flashinfer_installed(monkeypatch: pytest.MonkeyPatch) -> Warmed:
    """The CPU stand-in as ``flashinfer``; the fused set's warm-up (which needs CUDA) records its target instead."""
    fake_flashinfer.install(monkeypatch)
    module = importlib.import_module(fake_flashinfer.FLASHINFER_KERNELS_MODULE)
    warmed: Warmed = []
    monkeypatch.setattr(module, "warm_up", lambda kernels, config, dtype, device: warmed.append((config, dtype)))
    return warmed


@pytest.fixture
def flashinfer_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_flashinfer.uninstall(monkeypatch)


def hide_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make this process look like one without Triton (a CPU build of torch): importing it fails, and the Triton
    kernel modules are imported afresh."""
    import cudagraph.engine.kernels.triton as package

    monkeypatch.setitem(sys.modules, "triton", None)  # an import of it now raises ModuleNotFoundError
    for module in ("layer_set", "ops"):
        monkeypatch.delitem(sys.modules, f"{package.__name__}.{module}", raising=False)
        monkeypatch.delattr(package, module, raising=False)


@pytest.fixture
def triton_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_triton(monkeypatch)


@pytest.fixture
def triton_installed(monkeypatch: pytest.MonkeyPatch) -> Warmed:
    """Triton (needed); its set's warm-up (which needs CUDA) records its target instead."""
    pytest.importorskip("triton", reason="triton is not installed: pip install triton (CUDA builds of torch bring it)")
    module = importlib.import_module("cudagraph.engine.kernels.triton.layer_set")
    warmed: Warmed = []
    monkeypatch.setattr(module, "warm_up", lambda kernels, config, dtype, device: warmed.append((config, dtype)))
    return warmed


def test_choices_are_auto_then_the_registry() -> None:
    assert KERNEL_BACKEND_CHOICES == ("auto", "torch", "flashinfer", "triton")


@pytest.mark.parametrize(
    "changes",
    [{}, {"device": torch.device("cpu")}, {"dtype": torch.float32}, {"traced": True}],
    ids=["cuda-bf16", "cpu", "float32", "traced"],
)
def test_torch_is_there_for_everyone(changes: dict[str, object], flashinfer_missing: None) -> None:
    assert select_kernels("torch", target(**changes)) is TORCH_KERNELS


def test_auto_prefers_the_triton_kernels_wherever_they_run(
    triton_installed: Warmed, flashinfer_installed: Warmed, caplog: pytest.LogCaptureFixture
) -> None:
    """Triton's set fuses the most (and runs any dtype and head size); FlashInfer's comes next."""
    for changes in ({}, {"dtype": torch.float32}, {"config": QWEN3_0_6B.with_overrides(head_dim=96)}):
        assert select_kernels("auto", target(**changes)).name == "triton"
    assert len(triton_installed) == 3 and flashinfer_installed == []
    # A traced forward (tc_piecewise, compiled small buckets) calls the set's operations as custom ops.
    with caplog.at_level(logging.INFO, logger="cudagraph.engine.kernels.registry"):
        assert select_kernels("auto", target(traced=True)).name == "triton"
    assert "kernel backend auto: triton" in caplog.text and "does not trace" not in caplog.text
    assert select_kernels("triton", target(traced=True)).name == "triton"
    assert len(triton_installed) == 5 and flashinfer_installed == []


def test_auto_picks_the_fused_kernels_when_everything_holds_and_warms_them_up(
    flashinfer_installed: Warmed, triton_missing: None
) -> None:
    kernels = select_kernels("auto", target())
    assert kernels.name == "flashinfer"
    assert flashinfer_installed == [(QWEN3_0_6B, torch.bfloat16)]


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"device": torch.device("cpu")}, "flashinfer needs a CUDA device, but the model is on cpu"),
        ({"dtype": torch.float32}, "flashinfer needs float16 or bfloat16, but the model computes in float32"),
        ({"config": QWEN3_0_6B.with_overrides(head_dim=96)}, "head_dim is 96"),
        ({"config": QWEN3_0_6B.with_overrides(intermediate_size=3076)}, "intermediate_size is 3076"),
        ({"traced": True}, "a phase uses the tc_piecewise backend"),
    ],
    ids=["cpu", "float32", "head-dim", "intermediate", "traced"],
)
def test_auto_falls_back_to_torch_and_says_why(
    changes: dict[str, object],
    reason: str,
    flashinfer_installed: Warmed,
    triton_missing: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="cudagraph.engine.kernels.registry"):
        assert select_kernels("auto", target(**changes)) is TORCH_KERNELS
    assert flashinfer_installed == [], "nothing fused was built"
    (record,) = caplog.records
    assert record.getMessage().startswith("kernel backend auto: torch (") and reason in record.getMessage()


def test_auto_without_the_packages_is_torch(
    flashinfer_missing: None, triton_missing: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="cudagraph.engine.kernels.registry"):
        assert select_kernels("auto", target()) is TORCH_KERNELS
    assert "triton needs the triton package, which is not installed" in caplog.text
    assert "flashinfer needs the flashinfer-python package, which is not installed" in caplog.text


def test_asking_for_flashinfer_without_the_package_names_the_extra(flashinfer_missing: None) -> None:
    # Even where nothing else would hold either: the missing package is what to fix first.
    with pytest.raises(KernelBackendUnavailableError) as error:
        select_kernels("flashinfer", target(device=torch.device("cpu")))
    message = str(error.value)
    assert re.search(r"\(flashinfer[\w.]* is not installed\)", message), message
    assert "pip install 'cudagraph-engine[flashinfer]'" in message
    assert "--kernel-backend torch" in message and "\n" not in message


@pytest.mark.parametrize(
    ("changes", "needs", "found"),
    [
        ({"device": torch.device("cpu")}, "a CUDA device", "the model is on cpu"),
        ({"dtype": torch.float32}, "float16 or bfloat16", "the model computes in float32"),
        ({"config": QWEN3_0_6B.with_overrides(head_dim=32)}, "head_dim in (64, 128, 256, 512)", "head_dim is 32"),
        ({"traced": True}, "a forward that torch.compile does not trace", "tc_piecewise"),
    ],
    ids=["cpu", "float32", "head-dim", "traced"],
)
def test_asking_for_flashinfer_where_it_cannot_run_is_one_error_naming_the_condition(
    changes: dict[str, object], needs: str, found: str, flashinfer_installed: Warmed
) -> None:
    with pytest.raises(KernelBackendError) as error:
        select_kernels("flashinfer", target(**changes))
    message = str(error.value)
    assert not isinstance(error.value, KernelBackendUnavailableError)
    assert f"the flashinfer kernels need {needs}" in message and found in message
    assert message.endswith("use --kernel-backend torch or auto") and "\n" not in message
    assert flashinfer_installed == []


def test_an_unknown_name_lists_the_choices() -> None:
    with pytest.raises(KernelBackendError, match="unknown kernel backend 'cutlass'; choose one of auto, torch, flash"):
        select_kernels("cutlass", target())


@pytest.mark.parametrize(
    ("changes", "needs", "found"),
    [
        ({"device": torch.device("cpu")}, "a CUDA device", "the model is on cpu"),
        ({"device": torch.device("cpu"), "traced": True}, "a CUDA device", "the model is on cpu"),
    ],
    ids=["cpu", "cpu-traced"],
)
def test_asking_for_triton_where_it_cannot_run_is_one_error_naming_the_condition(
    changes: dict[str, object], needs: str, found: str
) -> None:
    pytest.importorskip("triton", reason="triton is not installed: pip install triton (CUDA builds of torch bring it)")
    with pytest.raises(KernelBackendError) as error:
        select_kernels("triton", target(**changes))
    message = str(error.value)
    assert f"the triton kernels need {needs}" in message and found in message and "\n" not in message


def test_asking_for_triton_without_it_names_the_extra(triton_missing: None) -> None:
    with pytest.raises(
        KernelBackendUnavailableError,
        match=r"the triton kernels need the triton package \(triton "
        r"is not installed\): pip install 'cudagraph-engine\[triton\]'",
    ):
        select_kernels("triton", target())


def phase_config(decode: Backend, prefill: Backend) -> CudaGraphConfig:
    return CudaGraphConfig(
        decode=PhaseConfig(decode, () if decode is Backend.DISABLED else (1, 2), 2),
        prefill=PhaseConfig(prefill, () if prefill is Backend.DISABLED else (16,), 16),
    )


@pytest.mark.parametrize(
    ("decode", "prefill", "compiled"),
    [
        (Backend.FULL, Backend.BREAKABLE, False),
        (Backend.DISABLED, Backend.DISABLED, False),
        (Backend.FULL, Backend.TC_PIECEWISE, True),
        (Backend.TC_PIECEWISE, Backend.DISABLED, True),
    ],
)
def test_a_tc_piecewise_phase_makes_the_forward_traced(decode: Backend, prefill: Backend, compiled: bool) -> None:
    assert (phase_config(decode, prefill).model_forward_compiler is not None) is compiled


def test_the_model_runner_sets_the_chosen_kernels_on_the_model(flashinfer_installed: Warmed) -> None:
    model = random_model(model_config_from_preset("tiny-qwen3-random"))
    runner = ModelRunner(model, resolve(), cache_config=CacheConfig(max_num_reqs=2, max_context_len=16))
    assert runner.kernels is TORCH_KERNELS and model.kernels is TORCH_KERNELS  # auto on a CPU
    with pytest.raises(KernelBackendError, match="need a CUDA device, but the model is on cpu"):
        ModelRunner(model, resolve(), cache_config=CacheConfig(2, 16), kernel_backend="flashinfer")


@pytest.mark.parametrize("preset", ["tiny-qwen3-random", "tiny-llama-random"])
def test_the_fused_set_wires_the_same_model_as_the_torch_set(preset: str, flashinfer_installed: Warmed) -> None:
    """The fused set's plumbing through the stand-in, float32 on the CPU: the same weights, heads, rotary table and
    positions give the torch kernels' logits (the stand-in computes what FlashInfer documents, rounding once)."""
    module = importlib.import_module(fake_flashinfer.FLASHINFER_KERNELS_MODULE)
    model = random_model(model_config_from_preset(preset), seed=3)
    expected = reference_logits(model, PROMPT)
    model.use_kernels(module.FlashInferKernels())
    assert model.rotary_cos_sin.dtype == torch.float32 and model.rotary_cos_sin.shape[1] == model.config.head_dim
    fused = reference_logits(model, PROMPT)
    torch.testing.assert_close(fused, expected, rtol=1e-4, atol=1e-4)
    model.use_kernels(TORCH_KERNELS)
    assert torch.equal(reference_logits(model, PROMPT), expected), "switching back restores the torch numerics"


def test_the_fused_set_writes_q_and_k_back_into_the_projection(flashinfer_installed: Warmed) -> None:
    module = importlib.import_module(fake_flashinfer.FLASHINFER_KERNELS_MODULE)
    model = random_model(model_config_from_preset("tiny-qwen3-random"))
    model.use_kernels(module.FlashInferKernels())
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    attend = dense_attend(model.config)

    def recording(layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        seen.append((k, v))
        return attend(layer_id, q, k, v)

    with torch.inference_mode():
        model(torch.tensor(PROMPT), torch.arange(len(PROMPT)), recording)
    for k, v in seen:
        assert k.stride() == v.stride() and v.data_ptr() == k.data_ptr() + k.shape[1] * k.element_size()
