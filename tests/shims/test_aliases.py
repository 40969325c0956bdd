"""Legacy attribute, method and enum-member names on top of the new classes."""

from __future__ import annotations

import warnings

import pytest

from cudagraph.config import Backend
from cudagraph.legacy import LegacyAliasesMixin, forget_warned_sites, install_legacy_aliases


@pytest.fixture(autouse=True)
def _fresh_sites() -> None:
    forget_warned_sites()


class EngineModelRunner(LegacyAliasesMixin):
    """An engine's model runner written with the new names only."""

    def __init__(self) -> None:
        self.decode_cuda_graph_runner = None
        self.prefill_cuda_graph_runner = None

    def init_decode_cuda_graph(self) -> str:
        self.decode_cuda_graph_runner = "decode-runner"
        return "decode"

    def init_prefill_cuda_graph(self) -> str:
        self.prefill_cuda_graph_runner = "prefill-runner"
        return "prefill"


def _deprecations(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]


def test_legacy_methods_forward_and_warn_once_per_site() -> None:
    runner = EngineModelRunner()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [runner.init_device_graphs() for _ in range(3)]
        prefill = runner.init_piecewise_cuda_graphs()
    assert results == ["decode"] * 3
    assert prefill == "prefill"
    messages = _deprecations(caught)
    assert len(messages) == 2
    assert "'init_device_graphs'" in messages[0] and "'init_decode_cuda_graph'" in messages[0]
    assert "'init_piecewise_cuda_graphs'" in messages[1]


def test_legacy_attributes_read_and_write_the_new_ones() -> None:
    runner = EngineModelRunner()
    runner.init_decode_cuda_graph()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert runner.graph_runner == "decode-runner"
        runner.piecewise_cuda_graph_runner = "replaced"
    assert runner.prefill_cuda_graph_runner == "replaced"
    assert len(_deprecations(caught)) == 2


def test_names_a_class_defines_itself_are_left_alone() -> None:
    class StillLegacy(LegacyAliasesMixin):
        def init_decode_cuda_graph(self) -> str:
            return "new"

        def init_device_graphs(self) -> str:
            return "own legacy method"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert StillLegacy().init_device_graphs() == "own legacy method"
    assert _deprecations(caught) == []


def test_runner_classes_reached_through_the_shim_gain_legacy_methods() -> None:
    from cudagraph.runner import DecodeCudaGraphRunner

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        from cudagraph.legacy.cuda_graph_runner import CudaGraphRunner
    assert CudaGraphRunner is DecodeCudaGraphRunner
    assert "capture_one_batch_size" in vars(DecodeCudaGraphRunner)


def test_enum_member_alias_is_the_same_member() -> None:
    install_legacy_aliases(Backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        member = Backend.TCPIECEWISE
    assert member is Backend.TC_PIECEWISE
    assert "TCPIECEWISE" not in Backend.__members__
    assert len(_deprecations(caught)) == 1
