"""Every backend choice of ``cudagraph-engine generate`` is checked before the model is built: one line, exit 2.

The model directories here have truncated weights, so a check that ran only after loading would report the
truncation instead: the line each test expects can only come from the check made before any weight is read.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cudagraph.config import resolve
from cudagraph.engine.attention import (
    AttentionBackendError,
    AttentionTarget,
    TorchAttentionBackend,
    attention_backend_class,
)
from cudagraph.engine.attention.choice import named_backend_problem
from cudagraph.engine.backend_checks import BackendChoices, check_backend_choices
from cudagraph.engine.commands import EXIT_USAGE
from cudagraph.engine.kernels import KernelBackendError
from cudagraph.engine.model import TensorParallelError, model_config_from_preset, random_model, save_model

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="checks the errors of a machine without CUDA, and this one has CUDA: `nox -s tests` on a CPU machine runs "
    "it",
)

GENERATE = ["generate", "--prompt-token-ids", "1,2,3", "--max-new-tokens", "2", "--device", "cpu"]
CPU_TARGET = AttentionTarget(torch.device("cpu"), torch.float32, 64)


@pytest.fixture(scope="module")
def truncated_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("models") / "truncated"
    save_model(random_model(model_config_from_preset("tiny-qwen3-random"), seed=0, device="cpu"), directory)
    for file in directory.glob("*.safetensors"):
        file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    return directory


CASES = {
    "triton-attention": (
        ["--attention-backend", "triton"],
        "the triton attention backend needs a CUDA device, but the KV cache is on cpu (TRITON_INTERPRET=1 runs its "
        "kernels on CPU tensors, slowly): use --attention-backend torch or auto",
    ),
    "triton-kernels": (
        ["--kernel-backend", "triton"],
        "the triton kernels need a CUDA device, but the model is on cpu: use --kernel-backend torch or auto",
    ),
    "prefill-full-with-torch-attention": (
        ["--attention-backend", "torch", "--cuda-graph-mode", '{"prefill": "full"}'],
        "prefill CUDA-graph backend 'full' captures attention inside the graph, which the 'torch' attention backend "
        "cannot yet",
    ),
}


DEEP_CASES = frozenset({"triton-attention", "triton-kernels"})
"""Cases that load the model under Triton's interpreter first (slow); the fast case loads it plainly."""


@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=pytest.mark.slow) if case in DEEP_CASES else case for case in sorted(CASES)]
)
def test_a_backend_choice_that_cannot_run_is_one_line_before_the_model_loads(case: str, truncated_model: Path) -> None:
    flags, expected = CASES[case]
    environ = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    command = [sys.executable, "-m", "cudagraph.engine", *GENERATE, "--model", str(truncated_model), *flags]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environ)
    assert result.returncode == EXIT_USAGE, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"cudagraph-engine generate: error: {expected}"), lines[0]


def test_the_backends_pass_when_they_can_run() -> None:
    model = model_config_from_preset("tiny-qwen3-random")
    choices = BackendChoices(attention="auto", kernels="auto", dtype="auto", speculates=True)
    check_backend_choices(choices, model, torch.device("cpu"), resolve())
    check_backend_choices(BackendChoices("torch", "torch", "float32"), model, torch.device("cpu"), resolve())


def test_kernels_of_a_tensor_parallel_rank_are_checked_at_its_size() -> None:
    # tiny-qwen3-random's MLP split over an impossible size: the rank's sizes are computed, and refused.
    model = model_config_from_preset("tiny-qwen3-random")
    choices = BackendChoices("torch", "torch", "auto", tp_size=7)
    with pytest.raises(TensorParallelError, match="tensor-parallel size 7 must divide num_attention_heads"):
        check_backend_choices(choices, model, torch.device("cpu"), resolve())


def test_an_unknown_kernel_set_is_refused_before_building() -> None:
    model = model_config_from_preset("tiny-qwen3-random")
    with pytest.raises(KernelBackendError, match="unknown kernel backend 'cutlass'"):
        check_backend_choices(BackendChoices("torch", "cutlass", "auto"), model, torch.device("cpu"), resolve())


def test_triton_attention_by_name_runs_on_the_cpu_under_its_interpreter() -> None:
    assert named_backend_problem("triton", CPU_TARGET, {"TRITON_INTERPRET": "1"}) is None
    assert "needs a CUDA device" in str(named_backend_problem("triton", CPU_TARGET, {}))
    assert named_backend_problem("torch", CPU_TARGET, {}) is None


def test_auto_attention_resolves_silently_to_a_class(caplog: pytest.LogCaptureFixture) -> None:
    assert attention_backend_class("auto", CPU_TARGET) is TorchAttentionBackend
    assert caplog.records == []
    with pytest.raises(AttentionBackendError, match="unknown attention backend 'paged'"):
        attention_backend_class("paged", CPU_TARGET)
