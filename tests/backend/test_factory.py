"""make_backend: every unknown or disallowed pair fails with one message naming what is allowed."""

from __future__ import annotations

import pytest
import torch

from cudagraph.backend import (
    BACKEND_CLASSES,
    BackendUnavailableError,
    BreakableCudaGraphBackend,
    FullCudaGraphBackend,
    make_backend,
)
from cudagraph.backend_utils import CudaGraphsUnavailableError
from cudagraph.config import ALLOWED_BACKENDS_PER_PHASE, Backend, ConfigError, Phase


def test_prefill_full_is_rejected_naming_the_allowed_backends() -> None:
    with pytest.raises(ConfigError) as raised:
        make_backend(Phase.PREFILL, Backend.FULL, "cuda")
    message = str(raised.value)
    assert "prefill" in message and "full" in message
    for allowed in ALLOWED_BACKENDS_PER_PHASE[Phase.PREFILL]:
        assert str(allowed) in message


@pytest.mark.parametrize(("phase", "backend"), [("decode", "pcg"), ("encode", "full"), ("", "breakable")])
def test_unknown_names_are_config_errors(phase: str, backend: str) -> None:
    with pytest.raises(ConfigError, match=r"unknown CUDA-graph (phase|backend).*allowed: "):
        make_backend(phase, backend, "cuda")


@pytest.mark.parametrize("phase", list(Phase))
def test_disabled_is_a_config_error_not_a_backend(phase: Phase) -> None:
    with pytest.raises(ConfigError, match="runs eagerly"):
        make_backend(phase, "disabled", "cuda")


@pytest.mark.parametrize("phase", list(Phase))
def test_tc_piecewise_says_it_is_not_available_yet(phase: Phase) -> None:
    with pytest.raises(BackendUnavailableError, match=r"tc_piecewise.*not available yet.*breakable") as raised:
        make_backend(phase, "tc_piecewise", "cuda")
    assert not isinstance(raised.value, NotImplementedError)


def test_every_graph_backend_has_a_table_row() -> None:
    assert set(BACKEND_CLASSES) == set(Backend) - {Backend.DISABLED}
    assert BACKEND_CLASSES[Backend.FULL] is FullCudaGraphBackend
    assert BACKEND_CLASSES[Backend.BREAKABLE] is BreakableCudaGraphBackend


@pytest.mark.parametrize(("phase", "backend"), [("decode", "full"), ("decode", "breakable"), ("prefill", "breakable")])
def test_allowed_pairs_reach_the_device_check(monkeypatch: pytest.MonkeyPatch, phase: str, backend: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(CudaGraphsUnavailableError, match="CUDA graphs need a CUDA device"):
        make_backend(phase, backend, "cuda", num_warmups=3)
