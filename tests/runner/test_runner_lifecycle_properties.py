"""Random lives of a runner: steps, sleeps, wakes and weight updates (in place, with new memory, and in debug mode
with new memory nobody announced), under both capture policies and both test doubles.

Whatever the order: every step that runs gives the eager logits of the weights current at that step; a step while
asleep is refused; no step replays a graph whose recorded addresses moved or were given back (the breakable double
replays captured tensors, as a CUDA graph replays captured addresses, so a stale replay would show in the logits).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from runner_helpers import StubModelRunner, stub_decode_batch
from test_runner_lazy_capture import lazy_config, lazy_runner

from cudagraph.config import Backend, CapturePolicy
from cudagraph.runner.graph_inputs import GraphInputsMovedError
from cudagraph.runner.lifecycle import RunnerAsleepError, RunnerState


class WeightedStub(StubModelRunner):
    """``StubModelRunner`` with two weights its graphs read: a lookup table and a scale."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.ones(self.table.shape[1])

    def graph_read_tensors(self) -> dict[str, torch.Tensor]:
        return {"table": self.table, "scale": self.scale}

    def forward(self, batch):  # type: ignore[no-untyped-def]
        self.forward_calls += 1
        return self.table.index_select(0, batch.input_ids) * self.scale + batch.positions[:, None].float()


OPERATIONS = st.one_of(
    st.tuples(st.just("step"), st.integers(1, 10)),
    st.tuples(st.sampled_from(["copy", "replace", "replace_silently", "sleep", "wake"]), st.integers(0, 1000)),
)


LIVES = {
    "kind": st.sampled_from([Backend.FULL, Backend.BREAKABLE]),
    "policy": st.sampled_from(list(CapturePolicy)),
    "debug": st.booleans(),
    "operations": st.lists(OPERATIONS, min_size=1, max_size=25),
}
"""Random lives: the backend double, the capture policy, debug replays, and what happens in which order."""


@settings(max_examples=15, deadline=None)
@given(**LIVES)
# Weights moved silently before a bucket's first use: captured then, its graph reads the new memory and replays (and
# is not refused), while a bucket captured before the move is.
@example(Backend.FULL, CapturePolicy.LAZY, True, [("replace_silently", 0), ("step", 1), ("step", 1)])
@example(Backend.FULL, CapturePolicy.LAZY, True, [("step", 1), ("replace_silently", 0), ("step", 2), ("step", 1)])
def test_every_step_of_any_life_gives_the_eager_logits_of_the_current_weights(
    kind: Backend, policy: CapturePolicy, debug: bool, operations: list[tuple[str, int]]
) -> None:
    live(kind, policy, debug, operations)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(**LIVES)
def test_every_step_of_many_more_lives_gives_the_eager_logits_of_the_current_weights(
    kind: Backend, policy: CapturePolicy, debug: bool, operations: list[tuple[str, int]]
) -> None:
    """The same property searched ten times longer (``nox -s slow``)."""
    live(kind, policy, debug, operations)


def live(kind: Backend, policy: CapturePolicy, debug: bool, operations: list[tuple[str, int]]) -> None:
    """Live ``operations`` with a graphed runner, checking every step against eager with the weights of that step."""
    model_runner = WeightedStub()
    runner, backend = lazy_runner(model_runner, lazy_config(policy=policy), kind, debug=debug)
    asleep = False
    # Buckets whose graphs were captured before weights were given new memory that no one told the runner about
    # (debug mode only); a bucket captured on first use after that reads the new memory and is not among them.
    unannounced: set[int] = set()
    for step, (operation, value) in enumerate(operations):
        generator = torch.Generator().manual_seed(value)
        if operation == "step":
            batch = stub_decode_batch(value, seed=step)
            route = runner.route(batch)
            if asleep:
                with pytest.raises(RunnerAsleepError):
                    runner.replay(batch)
                continue
            replays = route.bucket is not None
            record = runner.graph_inputs.recorded.get(route.bucket) if replays else None
            # A graph is refused when what it reads is no longer where it was captured. New memory can land at the
            # captured address again (a later replacement reusing a freed block): then the graph reads the current
            # weights and replays them.
            if (
                replays
                and route.bucket in unannounced
                and record is not None
                and record.moved(runner.graph_inputs.now())
            ):
                with pytest.raises(GraphInputsMovedError):
                    runner.replay(batch)
                runner.refresh_graphs()
                unannounced = set()
                continue
            eager = model_runner.forward(batch).clone()
            replayed_before = len(backend.replayed)
            torch.testing.assert_close(runner.replay(batch), eager)
            if len(backend.replayed) > replayed_before:
                bucket = backend.replayed[-1]
                record = runner.graph_inputs.recorded[bucket]
                assert record.moved(runner.graph_inputs.now()) == () and record.released() == ()
        elif operation == "copy":
            model_runner.table.copy_(torch.randn(model_runner.table.shape, generator=generator))
        elif operation in ("replace", "replace_silently"):
            if operation == "replace_silently" and not debug:
                continue
            model_runner.scale = torch.rand(model_runner.scale.shape, generator=generator) + 0.5
            if operation == "replace" and not asleep:
                runner.refresh_graphs()  # what ModelRunner.update_weights does after writing
                unannounced = set()
            elif operation == "replace_silently":
                unannounced |= set(runner.graph_inputs.recorded)
        elif operation == "sleep":
            if asleep:
                continue
            runner.sleep()
            asleep, unannounced = True, set()
            assert backend.entries == {} and runner.graph_inputs.recorded == {}
        elif operation == "wake":
            if not asleep:
                continue
            assert runner.wake() is RunnerState.AWAKE
            asleep = False
            expected = set() if policy is CapturePolicy.LAZY else {1, 2, 4, 8}
            assert set(backend.shapes) == expected
