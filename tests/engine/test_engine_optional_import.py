"""``import_optional``: the one place the engine's registries import a part that sits on an optional package."""

from __future__ import annotations

import sys

import pytest

from cudagraph.engine.optional_import import import_optional


class Unavailable(RuntimeError):
    pass


def test_a_missing_optional_package_is_the_registrys_own_error_naming_the_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "cudagraph_optional_probe", None)  # importing it raises ModuleNotFoundError
    with pytest.raises(Unavailable, match=r"^cudagraph_optional_probe\b") as caught:
        import_optional(
            "cudagraph_optional_probe.kernels", None, provided_by=("cudagraph_optional_probe",), unavailable=Unavailable
        )
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_missing_module_of_anything_else_propagates_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cudagraph_other_probe", None)
    with pytest.raises(ModuleNotFoundError, match="cudagraph_other_probe"):
        import_optional("cudagraph_other_probe", None, provided_by=("flashinfer",), unavailable=Unavailable)


def test_a_present_module_is_returned() -> None:
    module = import_optional(".layer_set", "cudagraph.engine.kernels", provided_by=("triton",), unavailable=Unavailable)
    assert module.__name__ == "cudagraph.engine.kernels.layer_set"
