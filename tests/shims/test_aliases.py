"""Legacy attribute, method and enum-member names on the new classes that own them, and on no other class."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator

import pytest

from cudagraph.config import Backend, Phase
from cudagraph.legacy import (
    LegacyAliasesMixin,
    forget_warned_sites,
    install_legacy_aliases,
    installed_legacy_aliases,
    remove_legacy_aliases,
)


@pytest.fixture(autouse=True)
def _fresh_sites() -> None:
    forget_warned_sites()


def _patched_library_classes() -> dict[type, tuple[str, ...]]:
    """Every class of an imported ``cudagraph`` module carrying aliases, with the names it carries."""
    found = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("cudagraph.") and module is not None:
            for value in list(vars(module).values()):
                if isinstance(value, type) and installed_legacy_aliases(value):
                    found[value] = installed_legacy_aliases(value)
    return found


@pytest.fixture(autouse=True)
def _restore_patched_classes() -> Iterator[None]:
    """Each test leaves the library classes as it found them: aliases it caused are taken off again."""
    before = _patched_library_classes()
    yield
    for cls in set(_patched_library_classes()) - set(before):
        remove_legacy_aliases(cls)
    assert _patched_library_classes() == before


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

    def capture_bucket(self) -> str:
        return "not a runner's method"


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


def test_the_mixin_gets_only_the_rows_it_owns() -> None:
    # capture_one_batch_size belongs to the runners: a model runner with a capture_bucket of its own does not get it
    assert set(installed_legacy_aliases(EngineModelRunner)) == {
        "graph_runner",
        "piecewise_cuda_graph_runner",
        "init_device_graphs",
        "init_piecewise_cuda_graphs",
    }
    assert not hasattr(EngineModelRunner, "capture_one_batch_size")


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
    assert "init_device_graphs" not in installed_legacy_aliases(StillLegacy)


def test_runner_classes_reached_through_the_shim_gain_only_their_legacy_methods() -> None:
    from cudagraph.runner import DecodeCudaGraphRunner

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        from cudagraph.legacy.cuda_graph_runner import CudaGraphRunner
    assert CudaGraphRunner is DecodeCudaGraphRunner
    assert "capture_one_batch_size" in vars(DecodeCudaGraphRunner)
    # the model runner's names are not the runner's: no alias that could only warn and fail
    for name in ("graph_runner", "piecewise_cuda_graph_runner", "init_device_graphs", "init_piecewise_cuda_graphs"):
        assert not hasattr(DecodeCudaGraphRunner, name), name


def test_a_class_owning_no_row_is_not_touched() -> None:
    from cudagraph.config import CudaGraphConfig

    before = dict(vars(CudaGraphConfig))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        from cudagraph.legacy.server_args import CudaGraphConfig as LegacyCudaGraphConfig
    assert LegacyCudaGraphConfig is CudaGraphConfig
    assert install_legacy_aliases(CudaGraphConfig) is CudaGraphConfig
    assert dict(vars(CudaGraphConfig)) == before
    assert not hasattr(CudaGraphConfig, "graph_runner")


def test_a_plain_class_with_the_new_names_is_not_an_owner() -> None:
    class Unrelated:
        decode_cuda_graph_runner = None

        def init_decode_cuda_graph(self) -> None:
            pass

    before = dict(vars(Unrelated))
    install_legacy_aliases(Unrelated)
    assert dict(vars(Unrelated)) == before


def test_enum_member_alias_is_the_same_member_and_only_on_its_enum() -> None:
    install_legacy_aliases(Backend)
    install_legacy_aliases(Phase)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        member = Backend.TCPIECEWISE
    assert member is Backend.TC_PIECEWISE
    assert "TCPIECEWISE" not in Backend.__members__
    assert len(_deprecations(caught)) == 1
    assert installed_legacy_aliases(Phase) == ()


def test_removed_aliases_leave_the_class_as_it_was() -> None:
    class Local(LegacyAliasesMixin):
        decode_cuda_graph_runner = None

    names = installed_legacy_aliases(Local)
    assert "graph_runner" in names
    assert remove_legacy_aliases(Local) == names
    assert not any(hasattr(Local, name) for name in names)
    assert remove_legacy_aliases(Local) == ()
