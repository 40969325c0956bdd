"""``--attention-backend auto``: the CLI's default; on the CPU it is torch, on CUDA Triton, then FlashInfer, then
torch, by each backend's conditions and whether its package is installed (faked here), with one INFO line saying
which it took and why it passed over the others."""

from __future__ import annotations

import logging
import sys

import pytest
import torch

import cudagraph.engine.attention as attention
from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
from cudagraph.engine.attention import (
    ATTENTION_BACKEND_CHOICES,
    AttentionTarget,
    TorchAttentionBackend,
    attention_backend_installed,
    choose_attention_backend,
    make_attention_backend,
)
from cudagraph.engine.commands import build_parser
from cudagraph.engine.kv_cache import ReqToTokenPool, TokenToKVPool
from cudagraph.engine.model import model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner

CHOICE_LOGGER = "cudagraph.engine.attention.choice"
CUDA = torch.device("cuda")  # only described: choosing never touches the device
EVERYTHING = frozenset({"triton", "flashinfer"})


def installed(*names: str):
    """A stand-in for ``attention_backend_installed``: only ``names`` have their package."""
    return lambda name: name in names


def test_auto_is_the_cli_default_and_a_choice() -> None:
    assert ATTENTION_BACKEND_CHOICES == ("auto", "torch", "flashinfer", "triton")
    args = build_parser().parse_args(["generate", "--preset", "tiny-qwen3-random", "--prompt-token-ids", "1"])
    assert args.attention_backend == "auto"


def test_auto_on_the_cpu_is_torch_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    shape = type("Shape", (), {"num_heads": 4, "num_kv_heads": 2, "head_dim": 64, "attention_scale": None})()
    req_pool = ReqToTokenPool(4, 16, "cpu")
    kv_pool = TokenToKVPool(64, 1, 2, 64, torch.bfloat16, "cpu")
    with caplog.at_level(logging.INFO, logger=CHOICE_LOGGER):
        backend = make_attention_backend("auto", req_pool, kv_pool, shape)
    assert type(backend) is TorchAttentionBackend
    (record,) = caplog.records
    assert record.levelno == logging.INFO
    assert record.getMessage() == (
        "attention backend auto: torch (triton needs a CUDA device, but the KV cache is on cpu; "
        "flashinfer needs a CUDA device, but the KV cache is on cpu)"
    )


def test_a_cpu_engine_asked_for_auto_attends_with_torch_and_names_it() -> None:
    model = random_model(model_config_from_preset("tiny-qwen3-random"), seed=0, dtype="float32", device="cpu")
    graphs = CudaGraphConfig(
        decode=PhaseConfig(Backend.FULL, (1, 2), 2), prefill=PhaseConfig(Backend.BREAKABLE, (16,), 16)
    )
    runner = ModelRunner(model, graphs, cache_config=CacheConfig(4, 32), attention_backend="auto")
    assert isinstance(runner.attn_backend, TorchAttentionBackend)
    assert runner.attention_backend_name == "torch"


@pytest.mark.parametrize(
    ("target", "packages", "chosen", "passed_over"),
    [
        (AttentionTarget(CUDA, torch.bfloat16, 128), EVERYTHING, "triton", ""),
        (AttentionTarget(CUDA, torch.float32, 32), EVERYTHING, "triton", ""),
        (
            AttentionTarget(CUDA, torch.bfloat16, 128),
            {"flashinfer"},
            "flashinfer",
            "triton needs the triton package, which is not installed",
        ),
        (
            AttentionTarget(CUDA, torch.bfloat16, 96),
            EVERYTHING,
            "torch",
            "triton needs a power-of-two head_dim of at least 16, but head_dim is 96; "
            "flashinfer needs head_dim in (64, 128, 256, 512), but head_dim is 96",
        ),
        (
            AttentionTarget(CUDA, torch.float32, 64),
            {"flashinfer"},
            "torch",
            "triton needs the triton package, which is not installed; "
            "flashinfer needs float16 or bfloat16, but the KV cache is float32",
        ),
        (
            AttentionTarget(CUDA, torch.float16, 64),
            set(),
            "torch",
            "triton needs the triton package, which is not installed; "
            "flashinfer needs the flashinfer-python package, which is not installed",
        ),
        (
            AttentionTarget(torch.device("cpu"), torch.bfloat16, 128),
            EVERYTHING,
            "torch",
            "triton needs a CUDA device, but the KV cache is on cpu; "
            "flashinfer needs a CUDA device, but the KV cache is on cpu",
        ),
    ],
    ids=["cuda", "cuda-float32", "no-triton", "head-dim-96", "no-triton-float32", "no-packages", "cpu"],
)
def test_auto_takes_the_first_backend_that_can_run_and_logs_why(
    target: AttentionTarget, packages: set[str], chosen: str, passed_over: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=CHOICE_LOGGER):
        assert choose_attention_backend(target, installed(*packages)) == chosen
    (record,) = caplog.records
    assert record.getMessage() == f"attention backend auto: {chosen}" + (f" ({passed_over})" if passed_over else "")


def test_auto_asks_only_about_packages_of_backends_whose_conditions_hold() -> None:
    asked: list[str] = []

    def recording(name: str) -> bool:
        asked.append(name)
        return False

    assert choose_attention_backend(AttentionTarget(CUDA, torch.float32, 128), recording) == "torch"
    assert asked == ["triton"], "flashinfer fails a condition (float32) before its package is looked for"


@pytest.mark.parametrize(("name", "package"), [("triton", "triton"), ("flashinfer", "flashinfer")])
def test_a_backend_without_its_package_is_not_installed(
    monkeypatch: pytest.MonkeyPatch, name: str, package: str
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # importing it now raises ModuleNotFoundError
    for module in (
        "attention.flashinfer_backend",
        "attention.triton_backend",
        "kernels.flashinfer.decode_attention",
        "kernels.triton.decode_attention",
        "kernels.triton.extend_attention",
    ):
        monkeypatch.delitem(sys.modules, f"cudagraph.engine.{module}", raising=False)
    assert attention_backend_installed(name) is False
    assert attention_backend_installed("torch") is True


def test_make_attention_backend_builds_what_auto_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    """``make_attention_backend("auto", ...)`` asks ``choose_attention_backend`` with the cache's device, dtype and
    head size, then builds that backend (here a stand-in for Triton's, which needs a GPU)."""
    seen: list[AttentionTarget] = []
    built: list[str] = []

    def choose(target: AttentionTarget, installed_fn) -> str:
        seen.append(target)
        return "triton"

    monkeypatch.setattr(attention, "choose_attention_backend", choose)
    monkeypatch.setitem(attention.ATTENTION_BACKENDS, "triton", lambda *args: built.append("triton") or "a backend")
    shape = type("Shape", (), {"num_heads": 2, "num_kv_heads": 1, "head_dim": 32, "attention_scale": None})()
    kv_pool = TokenToKVPool(16, 1, 1, 32, torch.float16, "cpu")
    assert make_attention_backend("auto", ReqToTokenPool(2, 8, "cpu"), kv_pool, shape) == "a backend"
    assert seen == [AttentionTarget(torch.device("cpu"), torch.float16, 32)] and built == ["triton"]
