"""make_backend: every unknown or disallowed pair fails with one message naming what is allowed."""

from __future__ import annotations

import pytest
import torch

from cudagraph.backend import (
    BACKEND_CLASSES,
    BreakableCudaGraphBackend,
    FullCudaGraphBackend,
    TcPiecewiseCudaGraphBackend,
    make_backend,
)
from cudagraph.backend_utils import CaptureOptions, CudaGraphsUnavailableError
from cudagraph.config import ALLOWED_BACKENDS_PER_PHASE, Backend, ConfigError, LegacyFlagWarning, Phase


def test_every_phase_backend_cell_is_allowed() -> None:
    for phase in Phase:
        assert ALLOWED_BACKENDS_PER_PHASE[phase] == frozenset(Backend)


@pytest.mark.parametrize(
    ("phase", "backend", "named"),
    [("decode", "pcg", "backend 'pcg'"), ("encode", "full", "phase 'encode'"), ("", "breakable", "phase ''")],
)
def test_unknown_names_are_config_errors_naming_the_value_and_the_allowed_ones(
    phase: str, backend: str, named: str
) -> None:
    with pytest.raises(ConfigError, match=rf"unknown {named}.*allowed") as raised:
        make_backend(phase, backend, "cuda")
    allowed = Phase if "phase" in named else Backend
    assert all(member.value in str(raised.value) for member in allowed)


@pytest.mark.parametrize("phase", list(Phase))
def test_disabled_is_the_configs_decision_not_a_backend(phase: Phase) -> None:
    """``make_backend`` asserts what the config guarantees: nobody asks for the backend of a phase it disabled."""
    with pytest.raises(AssertionError, match="runs eagerly"):
        make_backend(phase, "disabled", "cuda")


@pytest.mark.parametrize("phase", list(Phase))
def test_tc_piecewise_is_built_for_both_phases(monkeypatch: pytest.MonkeyPatch, phase: Phase) -> None:
    assert BACKEND_CLASSES[Backend.TC_PIECEWISE] is TcPiecewiseCudaGraphBackend
    assert all(cls is not None for cls in BACKEND_CLASSES.values())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(CudaGraphsUnavailableError, match="CUDA graphs need a CUDA device"):
        make_backend(phase, "tc_piecewise", "cuda", tc_piecewise_compiler="inductor")


@pytest.mark.parametrize(
    ("phase", "backend", "expected"),
    [
        ("decode", "full", FullCudaGraphBackend),
        ("decode", Backend.BREAKABLE, BreakableCudaGraphBackend),
        (Phase.PREFILL, "breakable", BreakableCudaGraphBackend),
    ],
)
def test_allowed_pairs_build_their_backend_with_the_options_given(
    monkeypatch: pytest.MonkeyPatch, phase: str, backend: str, expected: type
) -> None:
    built: list[tuple[type, dict[str, object]]] = []

    def record_init(self: object, device: object, **kwargs: object) -> None:
        built.append((type(self), {"device": device, **kwargs}))

    for cls in (FullCudaGraphBackend, BreakableCudaGraphBackend):
        monkeypatch.setattr(cls, "__init__", record_init)
    options = CaptureOptions(num_warmups=3, debug=True)
    make_backend(
        phase,
        backend,
        "cuda:1",
        options=options,
        share_global_pool=False,
        compile_max_shape=8,
        compile_mode="max-autotune-no-cudagraphs",
    )
    given: dict[str, object] = {
        "device": "cuda:1",
        "phase": Phase(phase),
        "options": options,
        "pool": None,
        "share_global_pool": False,
    }
    # Compiled small buckets are the full backend's alone.
    extra = (
        {"compile_max_shape": 8, "compile_mode": "max-autotune-no-cudagraphs"}
        if expected is FullCudaGraphBackend
        else {}
    )
    assert built == [(expected, {**given, **extra})]


@pytest.mark.parametrize("phase", list(Phase))
def test_tc_piecewise_gets_its_compiler_and_the_compile_mode(monkeypatch: pytest.MonkeyPatch, phase: Phase) -> None:
    built: list[dict[str, object]] = []
    monkeypatch.setattr(TcPiecewiseCudaGraphBackend, "__init__", lambda self, device, **kwargs: built.append(kwargs))
    make_backend(
        phase,
        "tc_piecewise",
        "cuda",
        tc_piecewise_compiler="inductor",
        compile_max_shape=8,
        compile_mode="lite",
        compile_cache_dir="/tmp/inductor",
    )
    assert built == [
        {
            "phase": phase,
            "options": None,
            "pool": None,
            "share_global_pool": True,
            "compiler": "inductor",
            "compile_mode": "lite",
            "compile_cache_dir": "/tmp/inductor",
        }
    ]


@pytest.mark.parametrize("backend_class", [FullCudaGraphBackend, TcPiecewiseCudaGraphBackend])
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune", "Default"])
def test_a_refused_compile_mode_fails_before_the_device_check(backend_class: type, mode: str) -> None:
    # On a machine without CUDA the device check would fail too: the mode is checked first, so the message is about
    # the mode wherever it runs.
    with pytest.raises(
        ConfigError, match=rf"^compile_mode: .*{mode!r}.*; allowed: default, max-autotune-no-cudagraphs"
    ):
        backend_class("cuda", compile_mode=mode)


@pytest.mark.parametrize(
    ("phase", "backend"), [("decode", "full"), ("decode", "breakable"), ("prefill", "breakable"), ("prefill", "full")]
)
def test_allowed_pairs_reach_the_device_check(monkeypatch: pytest.MonkeyPatch, phase: str, backend: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(CudaGraphsUnavailableError, match="CUDA graphs need a CUDA device"):
        make_backend(phase, backend, "cuda", options=CaptureOptions(num_warmups=3))


@pytest.mark.parametrize("spelling", ["tcpcg", "tcpiecewise"])
def test_a_legacy_backend_spelling_reads_as_tc_piecewise_with_one_warning(spelling: str) -> None:
    with (
        pytest.warns(LegacyFlagWarning, match=rf"'{spelling}' is a deprecated spelling of 'tc_piecewise'") as caught,
        pytest.raises(CudaGraphsUnavailableError),
    ):
        make_backend(Phase.PREFILL, spelling, "cuda")
    assert len([warning for warning in caught if warning.category is LegacyFlagWarning]) == 1
