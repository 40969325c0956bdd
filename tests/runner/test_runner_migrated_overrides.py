"""A runner subclass written against cudagraph 0.1.0, before and after ``nox -s migrate``, run against the runner.

The codemod fixture ``own_runner_overrides`` is that subclass (``.in.py``, overriding ``capture_one_shape``,
``replay_graph`` and ``replay_routed``) and its migration (its ``.out.diff`` applied, which the codemod tests prove
is what the migration writes). The migrated file must run on the new names alone, with no ``DeprecationWarning`` at
class creation or at any call, and give the same logits as the unmigrated file run through the runner's
compatibility path, which in turn give the eager forward's.
"""

from __future__ import annotations

import warnings
from types import ModuleType

import pytest
import torch
from codemods.fixture_cases import FIXTURES, expected_text
from runner_helpers import StubModelRunner, stub_decode_batch

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig

LEGACY = (FIXTURES / "own_runner_overrides.in.py").read_text()
MIGRATED = expected_text(FIXTURES / "own_runner_overrides.in.py")

CONFIG = CudaGraphConfig(
    decode=PhaseConfig(Backend.FULL, (1, 2, 4, 8), 8), prefill=PhaseConfig(Backend.DISABLED, (), 0)
)
SIZES = (1, 3, 8, 9)
"""Step sizes: an exact bucket, one padded to bucket 4, the largest bucket, one above it (eager)."""


def _load(text: str, name: str) -> ModuleType:
    module = ModuleType(name)
    module.__file__ = f"{name}.py"
    exec(compile(text, module.__file__, "exec"), module.__dict__)
    return module


def _captured(module: ModuleType) -> object:
    runner = module.TracingRunner(StubModelRunner(), CONFIG, backend=CpuReplayBackend(), show_progress=False)
    runner.capture()
    return runner


def _run(module: ModuleType) -> tuple[object, list[torch.Tensor]]:
    """Capture, then every size through the module's ``step`` (route given) and the runner's ``replay(batch)``
    (route left out, as the engine's callers may), and one bucket replayed alone."""
    runner = _captured(module)
    logits = []
    for size in SIZES:
        batch = stub_decode_batch(size, seed=size)
        logits.append(module.step(runner, batch).clone())
        logits.append(runner.replay(batch).clone())
    logits.append(module.replay_alone(runner, 4).clone())
    return runner, logits


def test_the_migrated_subclass_runs_on_the_new_names_without_a_deprecation_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        migrated = _load(MIGRATED, "own_runner_overrides_migrated")
        runner, _ = _run(migrated)
    assert sorted(runner.captured_shapes) == [1, 2, 4, 8]
    assert runner.replayed_shapes == [4]
    # each size twice (routed by the caller, then looked up by the override); 9 runs eagerly
    assert runner.step_buckets == [1, 1, 4, 4, 8, 8, None, None]
    for size in SIZES:
        batch = stub_decode_batch(size, seed=size)
        assert torch.equal(runner.replay(batch), runner.model_runner.forward(batch))


def test_the_migrated_subclass_gives_the_legacy_subclass_s_results() -> None:
    with pytest.warns(DeprecationWarning) as warned:
        legacy = _load(LEGACY, "own_runner_overrides_legacy")
    overridden = sorted(str(warning.message).split("(")[0].rpartition(" ")[2] for warning in warned)
    assert overridden == ["capture_one_shape", "replay_graph", "replay_routed"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        legacy_runner, legacy_logits = _run(legacy)
    migrated_runner, migrated_logits = _run(_load(MIGRATED, "own_runner_overrides_migrated"))
    assert len(migrated_logits) == len(legacy_logits)
    for before, after in zip(legacy_logits, migrated_logits, strict=True):
        assert torch.equal(before, after)
    assert migrated_runner.captured_shapes == legacy_runner.captured_shapes
    assert migrated_runner.step_buckets == legacy_runner.step_buckets
    assert migrated_runner.replayed_shapes == legacy_runner.replayed_shapes


def test_the_migrated_file_spells_no_old_name() -> None:
    text = MIGRATED
    for old in ("capture_one_shape", "replay_graph", "replay_routed"):
        assert f".{old}(" not in text and f"def {old}(" not in text, old
