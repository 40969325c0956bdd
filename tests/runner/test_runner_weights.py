"""Weights updated under captured graphs: a copy into the same memory keeps every graph valid (no recapture); new
memory is caught from the addresses recorded at capture and captured again, or refused, never replayed stale.

The breakable test double replays recorded ops with the tensors they were captured with, as a CUDA graph replays
the addresses it was captured with: a weight given new memory and not caught would replay the old values here too.
"""

from __future__ import annotations

import pytest
import torch
from runner_helpers import captured_runner, decode_batch, make_model_runner

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.backend_utils import CaptureOptions
from cudagraph.config import Backend
from cudagraph.engine.model_runner import ModelRunner
from cudagraph.runner import DecodeCudaGraphRunner
from cudagraph.runner.graph_inputs import GraphInputsMovedError


def engine_with_graphs(
    kind: Backend = Backend.BREAKABLE,
) -> tuple[ModelRunner, DecodeCudaGraphRunner, CpuReplayBackend]:
    model_runner = make_model_runner()
    runner, backend = captured_runner(model_runner, backend_kind=kind)
    model_runner.decode_cuda_graph_runner = runner
    return model_runner, runner, backend


def new_values(model_runner: ModelRunner, names: list[str], seed: int = 1) -> dict[str, torch.Tensor]:
    """Other random values for ``names`` (same shapes and dtypes)."""
    generator = torch.Generator().manual_seed(seed)
    params = dict(model_runner.model.named_parameters())
    return {name: torch.randn(params[name].shape, generator=generator) * 0.05 for name in names}


def layer_weights(model_runner: ModelRunner) -> list[str]:
    """Every parameter of the first decoder layer (a change there moves every logit)."""
    return [name for name, _ in model_runner.model.named_parameters() if ".0." in name and name.endswith("weight")]


def graph_and_eager(model_runner: ModelRunner, runner: DecodeCudaGraphRunner, size: int, seed: int):
    batch = decode_batch(model_runner, size, seed=seed)
    eager = model_runner.forward(batch).clone()
    return runner.replay(batch).clone(), eager


@pytest.mark.parametrize("kind", [Backend.FULL, Backend.BREAKABLE])
def test_an_in_place_update_replays_the_new_weights_with_no_recapture(kind: Backend) -> None:
    model_runner, runner, backend = engine_with_graphs(kind)
    before_graph, before_eager = graph_and_eager(model_runner, runner, 3, seed=1)
    torch.testing.assert_close(before_graph, before_eager, rtol=1e-5, atol=1e-5)
    captured = list(backend.captured_order)
    names = layer_weights(model_runner)
    assert names
    update = model_runner.update_weights(new_values(model_runner, names))
    assert update.in_place and update.recaptured == {"decode": ()}
    assert backend.captured_order == captured  # nothing captured again
    assert model_runner.weights_version == 1
    graph, eager = graph_and_eager(model_runner, runner, 3, seed=2)
    torch.testing.assert_close(graph, eager, rtol=1e-5, atol=1e-5)
    assert backend.replayed[-1] == 4
    # The update mattered: the same step under the old weights gives other logits.
    old_graph, _ = graph_and_eager(model_runner, runner, 3, seed=2)
    torch.testing.assert_close(old_graph, graph, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(before_graph, graph, rtol=1e-3, atol=1e-3)


def test_a_replaced_weight_would_replay_stale_values_unless_caught() -> None:
    """The control: a parameter given new memory behind the runner's back, and the graph replays the old one."""
    model_runner, runner, _ = engine_with_graphs(Backend.BREAKABLE)
    name = layer_weights(model_runner)[0]
    module_name, _, attribute = name.rpartition(".")
    fresh = new_values(model_runner, [name])[name]
    setattr(model_runner.model.get_submodule(module_name), attribute, torch.nn.Parameter(fresh, requires_grad=False))
    graph, eager = graph_and_eager(model_runner, runner, 3, seed=1)
    assert not torch.allclose(graph, eager, rtol=1e-4, atol=1e-4)  # stale: what the check exists to prevent
    assert runner.graph_inputs.stale() == {bucket: (name,) for bucket in runner.captured_buckets}
    assert runner.refresh_graphs() == runner.captured_buckets
    graph, eager = graph_and_eager(model_runner, runner, 3, seed=2)
    torch.testing.assert_close(graph, eager, rtol=1e-5, atol=1e-5)
    assert runner.graph_inputs.stale() == {}


def test_an_update_with_new_memory_recaptures_the_graphs_that_read_it() -> None:
    model_runner, runner, backend = engine_with_graphs(Backend.BREAKABLE)
    graph_and_eager(model_runner, runner, 3, seed=1)
    buckets = runner.captured_buckets
    captured = len(backend.captured_order)
    update = model_runner.update_weights(new_values(model_runner, layer_weights(model_runner)), in_place=False)
    assert update.recaptured == {"decode": buckets}
    assert len(backend.captured_order) == captured + len(buckets)
    assert runner.captured_buckets == buckets
    for size, seed in [(3, 2), (1, 3), (8, 4)]:
        graph, eager = graph_and_eager(model_runner, runner, size, seed=seed)
        torch.testing.assert_close(graph, eager, rtol=1e-5, atol=1e-5)


def test_refusing_moved_weights_is_one_error_naming_them_and_nothing_replays_stale() -> None:
    model_runner, runner, backend = engine_with_graphs(Backend.BREAKABLE)
    captured = runner.captured_buckets
    names = layer_weights(model_runner)[:2]
    with pytest.raises(GraphInputsMovedError) as raised:
        model_runner.update_weights(new_values(model_runner, names), in_place=False, on_moved="raise")
    message = str(raised.value)
    assert all(name in message for name in names) and "in place" in message
    assert backend.replayed == [] and runner.captured_buckets == captured


def test_debug_mode_checks_the_addresses_before_every_replay() -> None:
    model_runner = make_model_runner()
    runner, backend = captured_runner(model_runner, backend_kind=Backend.BREAKABLE, options=CaptureOptions(debug=True))
    graph, eager = graph_and_eager(model_runner, runner, 2, seed=1)
    torch.testing.assert_close(graph, eager, rtol=1e-5, atol=1e-5)
    name = layer_weights(model_runner)[0]
    module_name, _, attribute = name.rpartition(".")
    batch = decode_batch(model_runner, 2, seed=2)
    fresh = new_values(model_runner, [name])[name]
    setattr(model_runner.model.get_submodule(module_name), attribute, torch.nn.Parameter(fresh, requires_grad=False))
    replayed = len(backend.replayed)
    with pytest.raises(GraphInputsMovedError, match=name):
        runner.replay(batch)
    assert len(backend.replayed) == replayed


def test_unknown_names_and_new_shapes_are_refused_before_anything_is_written() -> None:
    model_runner, _, _ = engine_with_graphs()
    name = layer_weights(model_runner)[0]
    before = dict(model_runner.model.named_parameters())[name].clone()
    with pytest.raises(ValueError, match="no parameter or buffer named"):
        model_runner.update_weights({name: torch.zeros_like(before), "nope.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="other shapes"):
        model_runner.update_weights({name: torch.zeros(1)})
    torch.testing.assert_close(dict(model_runner.model.named_parameters())[name], before)
    assert model_runner.weights_version == 0
