"""A runner hands the config's compile settings (``--torch-compile-max-bs``, ``--torch-compile-mode``,
``--tc-piecewise-compiler``) to the real backend it makes, on a machine without CUDA."""

from __future__ import annotations

import pytest
import torch
from runner_helpers import make_model_runner

import cudagraph.backend.base
from cudagraph.backend import FullCudaGraphBackend, TcPiecewiseCudaGraphBackend
from cudagraph.config import Backend, ConfigError, resolve
from cudagraph.runner import DecodeCudaGraphRunner, PrefillCudaGraphRunner


@pytest.fixture
def cuda_device_claimed(monkeypatch: pytest.MonkeyPatch) -> None:
    # The backends' one CUDA check at construction; nothing below touches the device.
    monkeypatch.setattr(cudagraph.backend.base, "require_cuda", lambda device: torch.device("cuda", 0))


@pytest.mark.parametrize("mode", ["max-autotune-no-cudagraphs", "lite", None])
def test_full_decode_backend_gets_the_compile_mode_and_size(mode: str | None, cuda_device_claimed: None) -> None:
    config = resolve(decode_cuda_graph_bs=[1, 2, 4, 8], torch_compile_max_bs=4, torch_compile_mode=mode)
    runner = DecodeCudaGraphRunner(make_model_runner(config=config), config, show_progress=False)
    assert isinstance(runner.backend, FullCudaGraphBackend)
    assert (runner.backend.compile_max_shape, runner.backend.compile_mode) == (4, mode)


@pytest.mark.parametrize("compiler", ["inductor", "eager"])
def test_tc_piecewise_backend_gets_the_compile_mode(compiler: str, cuda_device_claimed: None) -> None:
    config = resolve(
        prefill_cuda_graph_backend="tc_piecewise",
        prefill_cuda_graph_tokens=[16, 32],
        tc_piecewise_compiler=compiler,
        torch_compile_mode="max-autotune-no-cudagraphs",
    )
    runner = PrefillCudaGraphRunner(make_model_runner(config=config), config, show_progress=False)
    assert isinstance(runner.backend, TcPiecewiseCudaGraphBackend)
    assert runner.backend.backend is Backend.TC_PIECEWISE
    assert (runner.backend.compiler.compiler, runner.backend.compiler.mode) == (compiler, "max-autotune-no-cudagraphs")


def test_a_hand_built_config_with_a_bad_mode_fails_at_the_backend(cuda_device_claimed: None) -> None:
    # resolve() never yields this; a config built by hand reaches the backend's own check.
    config = resolve(decode_cuda_graph_bs=[1, 2], torch_compile_max_bs=2)
    bad = config.__class__(**{**vars(config), "torch_compile_mode": "reduce-overhead"})
    with pytest.raises(ConfigError, match="'reduce-overhead' captures its own CUDA graphs"):
        DecodeCudaGraphRunner(make_model_runner(config=config), bad, show_progress=False)
