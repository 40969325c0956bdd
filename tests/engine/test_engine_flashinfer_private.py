"""The adapter of FlashInfer's private attributes: its errors against stand-in wrappers (anywhere), and, where
flashinfer is installed, that the installed release is the one it was proven on and still sets every attribute it
reads (a FlashInfer that moves one fails here, naming it)."""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: cudagraph-config requires tomli there
    import tomli as tomllib

from cudagraph.engine.kernels.flashinfer import private_api
from cudagraph.engine.kernels.flashinfer.private_api import (
    DECODE_WRAPPER_ATTRIBUTES,
    PINNED_WORKSPACE,
    PROVEN_ON,
    PROVEN_RANGE,
    ROUTES_AWAY,
    FlashInferPrivateApiError,
    direct_decode_launch,
    in_proven_range,
    parse_version,
    read_private,
    share_pinned_workspace,
    utils_helpers,
)

INSTALL_HINT = "pip install flashinfer-python (or carry .whl) to check FlashInfer's private attributes"


def _flashinfer_unavailable() -> str | None:
    """Why flashinfer cannot be imported here (the skip reason), or None."""
    if importlib.util.find_spec("flashinfer") is None:
        return INSTALL_HINT
    try:
        importlib.import_module("flashinfer")
    except Exception as error:  # installed for another interpreter or torch build: say so, and how to get one
        return f"{INSTALL_HINT} (flashinfer does not import here: {type(error).__name__}: {error})"
    return None


_UNAVAILABLE = _flashinfer_unavailable()
NEEDS_FLASHINFER = pytest.mark.skipif(_UNAVAILABLE is not None, reason=_UNAVAILABLE or "")


class StandInWrapper:
    """An object with the attributes a planned FlashInfer 0.5.3 CUDA-graph decode wrapper has, less ``without``."""

    def __init__(self, *without: str) -> None:
        for attr in DECODE_WRAPPER_ATTRIBUTES:
            if attr.name not in without:
                setattr(self, attr.name, None)


def test_the_adapter_names_a_missing_plan_attribute_the_method_and_the_proven_range() -> None:
    wrapper = StandInWrapper("_plan_info")
    with pytest.raises(FlashInferPrivateApiError) as raised:
        read_private(wrapper, [attr.name for attr in DECODE_WRAPPER_ATTRIBUTES])
    message = str(raised.value)
    assert message.startswith("FlashInfer's StandInWrapper has no _plan_info (set by plan(): plan the wrapper before")
    assert PROVEN_RANGE in message and f"proven on {PROVEN_ON}" in message
    assert "cudagraph.engine.kernels.flashinfer.private_api" in message


def test_every_missing_attribute_is_named_at_once() -> None:
    with pytest.raises(FlashInferPrivateApiError, match=r"has no _kv_layout \(set by __init__;.*, _sm_scale \(set by"):
        read_private(StandInWrapper("_kv_layout", "_sm_scale"), ["_kv_layout", "_backend", "_sm_scale"])


def test_the_direct_launch_reads_through_the_adapter_before_anything_else() -> None:
    """A wrapper of another FlashInfer is one clear error (which ``kernels.flashinfer.decode_attention`` turns into
    ``wrapper.run``), raised before any FlashInfer helper is imported."""
    tensor = torch.zeros(1, 2, 8)
    with pytest.raises(FlashInferPrivateApiError, match="has no _cached_module"):
        direct_decode_launch(StandInWrapper("_cached_module"), tensor, torch.zeros(1, 2, 1, 2, 8), tensor)


class PlannedStandIn(StandInWrapper):
    """A stand-in as plainly configured as the graph wrapper the FlashInfer backend binds directly."""

    def __init__(self, **routes: bool) -> None:
        super().__init__()
        self._use_cuda_graph, self._use_tensor_cores, self._backend, self._kv_layout = True, False, "fa2", "NHD"
        self._cached_module = SimpleNamespace(run=lambda *args: None)
        self._cached_q_data_type = self._cached_kv_data_type = torch.float32
        for name, value in routes.items():
            setattr(self, name, value)


@pytest.mark.parametrize("route", [attr.name for attr in ROUTES_AWAY])
def test_a_flashinfer_07_wrapper_that_routes_away_from_the_decode_kernel_is_not_bound(
    route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FlashInfer 0.7's run takes cuDNN, XQA or scale-factor paths where its plan chose them: then the bound launch
    would call the wrong kernel, so the caller keeps ``wrapper.run``. With the switch off (0.7) or absent (0.5) the
    same wrapper binds."""
    helpers = SimpleNamespace(
        TensorLayout=SimpleNamespace(NHD=SimpleNamespace(value=0)),
        _unpack_paged_kv_cache=lambda cache, layout: (cache[:, 0], cache[:, 1]),
        _get_cache_alibi_slopes_buf=lambda heads, device: None,
        device_support_pdl=lambda device: False,
    )
    monkeypatch.setattr(private_api, "utils_helpers", lambda: helpers)
    q, cache = torch.zeros(1, 2, 8), torch.zeros(1, 2, 1, 2, 8)
    assert direct_decode_launch(PlannedStandIn(), q, cache, torch.zeros_like(q)) is not None  # 0.5: no switches
    assert direct_decode_launch(PlannedStandIn(**{route: False}), q, cache, torch.zeros_like(q)) is not None
    assert direct_decode_launch(PlannedStandIn(**{route: True}), q, cache, torch.zeros_like(q)) is None


def test_sharing_the_pinned_workspace_needs_the_attribute() -> None:
    pinned = torch.zeros(4, dtype=torch.uint8)
    wrapper = StandInWrapper()
    share_pinned_workspace(wrapper, pinned)
    assert vars(wrapper)[PINNED_WORKSPACE] is pinned
    renamed = StandInWrapper(PINNED_WORKSPACE)
    with pytest.raises(FlashInferPrivateApiError, match=f"has no {PINNED_WORKSPACE} \\(set by __init__"):
        share_pinned_workspace(renamed, pinned)
    assert PINNED_WORKSPACE not in vars(renamed), "nothing is set on a wrapper that would not read it"


@pytest.mark.parametrize(
    ("version", "inside"),
    [
        ("0.5.3", True),
        ("0.5.9", True),
        ("0.5.3+cu130", True),
        ("0.5.2", False),
        ("0.6.0", False),
        ("0.6.0rc1", False),
        ("0.6.18", False),
        ("0.7.0", False),
        ("0.7.4", False),
        ("0.7.4+cu130", False),
        ("0.8.0", False),
        ("1.0", False),
        ("unknown", False),
    ],
)
def test_the_proven_range_has_an_upper_bound(version: str, inside: bool) -> None:
    assert PROVEN_RANGE == ">=0.5.3,<0.6"
    assert in_proven_range(version) is inside
    if version != "unknown":  # the specifier users install agrees (a local version such as +cu130 aside)
        assert (Version(version).public in SpecifierSet(PROVEN_RANGE)) is inside


# -- where flashinfer is installed ------------------------------------------------------------------------------------


def test_the_engines_flashinfer_extra_asks_for_the_proven_range() -> None:
    """The range users install (``cudagraph-engine[flashinfer]``) is the range the adapter was proven on."""
    pyproject = Path(__file__).resolve().parents[2] / "packages" / "cudagraph-engine" / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["flashinfer"]
    requirement = next(Requirement(text) for text in extras if Requirement(text).name == "flashinfer-python")
    assert requirement.specifier == SpecifierSet(PROVEN_RANGE), (
        f"cudagraph-engine[flashinfer] asks for flashinfer-python{requirement.specifier}, the adapter is proven on "
        f"{PROVEN_RANGE}: move both together"
    )


@NEEDS_FLASHINFER
def test_the_installed_flashinfer_is_in_the_proven_range() -> None:
    import flashinfer

    version = str(getattr(flashinfer, "__version__", "unknown"))
    assert in_proven_range(version), (
        f"flashinfer {version} is outside {PROVEN_RANGE}, the releases whose private attributes "
        "cudagraph.engine.kernels.flashinfer.private_api was proven on: run this file and "
        "tests/gpu/engine/test_gpu_flashinfer_private.py with it, then move PROVEN_RANGE"
    )


@NEEDS_FLASHINFER
def test_the_private_helpers_are_in_flashinfer_utils() -> None:
    helpers = utils_helpers()
    assert isinstance(helpers, SimpleNamespace)
    assert helpers.TensorLayout.NHD.value is not None


def _assigns(source: str, name: str) -> bool:
    return re.search(rf"self\.{re.escape(name)}\s*(:[^=\n]*)?=(?!=)", source) is not None


def _setting_sources(set_by: str) -> list[str]:
    """The source of the wrapper method ``set_by`` and, where ``plan`` hands its work on (FlashInfer 0.7's
    ``_plan_impl``), of that method too."""
    import flashinfer

    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper
    names = [set_by, "_plan_impl"] if set_by == "plan" else [set_by]
    return [inspect.getsource(getattr(wrapper, name)) for name in names if hasattr(wrapper, name)]


@NEEDS_FLASHINFER
@pytest.mark.parametrize("attr", DECODE_WRAPPER_ATTRIBUTES, ids=lambda attr: attr.name)
def test_the_decode_wrapper_still_sets_each_attribute_the_adapter_reads(attr) -> None:
    """Read from FlashInfer's source, so it needs no device: the method the table names still assigns the
    attribute."""
    import flashinfer

    sources = _setting_sources(attr.set_by)
    assert sources, (
        f"flashinfer {flashinfer.__version__}: BatchDecodeWithPagedKVCacheWrapper has no {attr.set_by}, which set "
        f"{attr.name} in {PROVEN_ON} ({attr.use}); update cudagraph.engine.kernels.flashinfer.private_api"
    )
    assert any(_assigns(source, attr.name) for source in sources), (
        f"flashinfer {flashinfer.__version__}: BatchDecodeWithPagedKVCacheWrapper.{attr.set_by} no longer sets "
        f"{attr.name}, which the engine reads for {attr.use} (proven on {PROVEN_ON}, range {PROVEN_RANGE}); update "
        "cudagraph.engine.kernels.flashinfer.private_api"
    )


@NEEDS_FLASHINFER
@pytest.mark.parametrize("attr", ROUTES_AWAY, ids=lambda attr: attr.name)
def test_a_flashinfer_07_wrapper_still_names_each_route_away_from_the_decode_kernel(attr) -> None:
    """On 0.7 and later, each switch the bound launch checks is still set where the table says (a renamed switch
    would let the launch mirror a kernel ``run`` no longer calls); 0.5 has none of them."""
    import flashinfer

    if parse_version(flashinfer.__version__) < (0, 7, 0):
        assert not any(
            _assigns(source, attr.name) for source in _setting_sources(attr.set_by) + _setting_sources("__init__")
        ), f"flashinfer {flashinfer.__version__} already sets {attr.name}: add it to the proven releases' notes"
        return
    assert any(_assigns(source, attr.name) for source in _setting_sources(attr.set_by)), (
        f"flashinfer {flashinfer.__version__}: BatchDecodeWithPagedKVCacheWrapper.{attr.set_by} no longer sets "
        f"{attr.name} ({attr.use}); update ROUTES_AWAY in cudagraph.engine.kernels.flashinfer.private_api"
    )


def test_the_source_check_tells_an_assignment_from_a_comparison_or_a_rename() -> None:
    source = (
        "def __init__(self):\n"
        "    self._plan_info_v2 = None\n"
        "    self._kv_layout: str = 'NHD'\n"
        "    if self._backend == 'fa2':\n"
        "        pass\n"
    )
    assert _assigns(source, "_kv_layout")
    assert not _assigns(source, "_plan_info") and not _assigns(source, "_backend")
