"""The runner methods renamed after 0.1.0 (``capture_one_shape`` → ``capture_bucket``, ``replay_graph`` →
``replay_bucket``, ``replay_routed`` → ``replay``): calls of the old names warn and give the new names' results, and
a subclass that still overrides an old name keeps being called (under the new name), warned once at class creation.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from runner_helpers import StubModelRunner, stub_decode_batch

import cudagraph.runner
from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig, RenameKind, load_renames
from cudagraph.runner import BaseCudaGraphRunner, DecodeCudaGraphRunner, ForwardBatch, Route
from cudagraph.runner.renamed_methods import RENAMED_METHODS

CONFIG = CudaGraphConfig(
    decode=PhaseConfig(Backend.FULL, (1, 2, 4, 8), 8), prefill=PhaseConfig(Backend.DISABLED, (), 0)
)


def captured(cls: type[DecodeCudaGraphRunner] = DecodeCudaGraphRunner) -> DecodeCudaGraphRunner:
    runner = cls(StubModelRunner(), CONFIG, backend=CpuReplayBackend(), show_progress=False)
    runner.capture()
    return runner


def test_every_renamed_method_keeps_its_old_name_on_the_runner() -> None:
    for old, new in RENAMED_METHODS.items():
        assert callable(getattr(DecodeCudaGraphRunner, old)) and callable(getattr(DecodeCudaGraphRunner, new))


def test_old_names_warn_and_give_the_new_names_results() -> None:
    runner = captured()
    batch = stub_decode_batch(3)
    expected = runner.replay(batch).clone()
    with pytest.warns(DeprecationWarning, match=r"replay_routed\(\) is deprecated .* use replay\(\)"):
        assert torch.equal(runner.replay_routed(batch, runner.route(batch)), expected)
    with pytest.warns(DeprecationWarning, match=r"replay_graph\(\) is deprecated .* use replay_bucket\(\)"):
        assert torch.equal(runner.replay_graph(4)[:3], expected)
    renamed = r"capture_one_shape\(\) is deprecated .* use capture_bucket\(\)"
    with pytest.warns(DeprecationWarning, match=renamed), runner.backend.capture_session():
        output = runner.capture_one_shape(2)
    assert output.shape[0] == 2


def test_a_subclass_overriding_the_old_capture_hook_is_still_called_for_every_bucket() -> None:
    calls: list[int] = []
    with pytest.warns(DeprecationWarning, match="Legacy overrides capture_one_shape"):

        class Legacy(DecodeCudaGraphRunner):
            def capture_one_shape(self, shape: int) -> torch.Tensor:
                calls.append(shape)
                return super().capture_one_shape(shape)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        runner = captured(Legacy)
    assert sorted(calls) == [1, 2, 4, 8] and runner.captured_buckets == (1, 2, 4, 8)
    batch = stub_decode_batch(5)
    assert torch.equal(runner.replay(batch), runner.model_runner.forward(batch))


def test_a_subclass_overriding_the_old_replay_serves_every_step_and_its_super_call_replays() -> None:
    seen: list[int | None] = []
    with pytest.warns(DeprecationWarning, match="Legacy overrides replay_routed"):

        class Legacy(DecodeCudaGraphRunner):
            def replay_routed(self, batch: ForwardBatch, route: Route) -> torch.Tensor:
                seen.append(route.bucket)
                return super().replay_routed(batch, route)

    runner = captured(Legacy)
    plain = captured()
    for size in (3, 9):  # 3 replays bucket 4; 9 runs eagerly
        batch = stub_decode_batch(size, seed=size)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            assert torch.equal(runner.replay(batch), plain.replay(batch))
    assert seen == [4, None]
    assert runner.metrics.replays == 1


OWN_ROWS = {row.old: row for row in load_renames().of_kind(RenameKind.METHOD) if row.own_name}
"""The rename table's rows of the runner's own earlier method names (what ``nox -s migrate`` rewrites)."""


def test_the_rename_table_and_renamed_methods_name_the_same_renames() -> None:
    assert {old: row.new for old, row in OWN_ROWS.items()} == RENAMED_METHODS


@pytest.mark.parametrize("old", sorted(RENAMED_METHODS))
def test_each_row_owns_every_runner_class_and_says_what_the_alias_says(old: str) -> None:
    row = OWN_ROWS[old]
    runner_classes = {
        f"cudagraph.runner.{name}"
        for name in cudagraph.runner.__all__
        if isinstance(cls := getattr(cudagraph.runner, name), type) and issubclass(cls, BaseCudaGraphRunner)
    }
    assert set(row.owners) == runner_classes
    alias = inspect.signature(getattr(BaseCudaGraphRunner, old)).parameters
    new = inspect.signature(getattr(BaseCudaGraphRunner, row.new)).parameters
    renamed = {before: after for before, after in zip(alias, new, strict=True) if before != after}
    assert dict(row.parameters) == renamed
    runner = captured()
    call = {
        "capture_one_shape": (2,),
        "replay_graph": (2,),
        "replay_routed": (stub_decode_batch(2), None),
        "static_input_tensors": (2,),
    }[old]
    with pytest.warns(DeprecationWarning) as warned, runner.backend.capture_session():
        getattr(runner, old)(*call)
    (message,) = [str(warning.message) for warning in warned]
    assert f"since cudagraph-runner {row.deprecated_in} and will be removed in {row.removed_in}" in message
