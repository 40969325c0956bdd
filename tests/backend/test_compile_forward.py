"""``compile_model_forward`` and ``CompileStats`` on the CPU: one compilation for every token count, trace errors
named, recompiles after capture counted, and the compiled forward reached through the context only where set."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

import pytest
import torch
import torch._dynamo

from cudagraph.backend import CompileStats, ModelTraceError
from cudagraph.backend.compile_forward import compile_model_forward, counting_inductor, inductor_mode_options
from cudagraph.backend_utils import compiled_model_forward, is_in_torch_compile_warmup
from cudagraph.config import TORCH_COMPILE_MODES, ConfigError
from cudagraph.config.vocabulary import CUDA_GRAPH_COMPILE_MODES


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def counting_eager(stats: CompileStats) -> Callable[[torch.fx.GraphModule, Sequence[Any]], Callable[..., Any]]:
    def backend(graph_module: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        stats.compilations += 1
        return graph_module.forward

    return backend


def model_forward(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return (input_ids.float() * 2 + positions.float()).sin()


class HostRunner:
    """What a host model runner does per step: run the compiled forward where the context gives one."""

    def __init__(self) -> None:
        self.warmup_seen = False

    def step(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.warmup_seen = self.warmup_seen or is_in_torch_compile_warmup()
        forward = compiled_model_forward() or model_forward
        return forward(input_ids, positions)


def test_one_compilation_serves_every_token_count_including_one() -> None:
    stats = CompileStats()
    host = HostRunner()
    ids, positions = torch.arange(8), torch.arange(8)
    compiled = compile_model_forward(
        model_forward, lambda: host.step(ids, positions), (ids, positions), counting_eager(stats), stats
    )
    assert host.warmup_seen, "the compile step must run under the compile-warm-up flag"
    assert compiled_model_forward() is None, "the compiled forward leaks out of the compile step"
    for tokens in (1, 2, 3, 16, 40):
        ids, positions = torch.arange(tokens), torch.arange(tokens)
        torch.testing.assert_close(compiled(ids, positions), model_forward(ids, positions))
    assert stats.compilations == 1 and stats.recompiles == 0
    assert stats.compile_seconds > 0


def test_recompiles_after_capture_are_counted_apart() -> None:
    stats = CompileStats(compilations=1)
    assert stats.recompiles_at_replay == 0  # no capture finished yet
    stats.compilations_at_capture = 1
    assert stats.recompiles_at_replay == 0
    stats.compilations = 3
    assert stats.recompiles_at_replay == 2 and stats.recompiles == 2
    assert stats.summary().startswith("3 compilation(s) in ")


_STEP: ContextVar[float] = ContextVar("step", default=1.0)


def untraceable_forward(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return input_ids.float() + _STEP.get()


def test_a_forward_that_does_not_trace_is_one_error_naming_it() -> None:
    stats = CompileStats()
    ids = torch.arange(4)

    def step() -> torch.Tensor:
        forward = compiled_model_forward()
        assert forward is not None
        return forward(ids, ids)

    with pytest.raises(ModelTraceError) as raised:
        compile_model_forward(untraceable_forward, step, (ids, ids), counting_eager(stats), stats)
    message = str(raised.value)
    assert "untraceable_forward" in message and "test_compile_forward.py:" in message
    assert "breakable backend" in message


def test_a_mode_that_captures_its_own_graphs_is_refused() -> None:
    with pytest.raises(ValueError, match="captures its own CUDA graphs"):
        counting_inductor(CompileStats(), "reduce-overhead")
    counting_inductor(CompileStats(), "max-autotune-no-cudagraphs")  # accepted


def test_the_allowed_modes_are_torchs_modes_without_cuda_graphs_of_their_own() -> None:
    # Guards the config's vocabulary against the installed torch: a new mode, or one that starts capturing CUDA
    # graphs, must be sorted into one of the two tables.
    from torch._inductor import list_mode_options

    torch_modes = list_mode_options()
    assert set(TORCH_COMPILE_MODES) | set(CUDA_GRAPH_COMPILE_MODES) == set(torch_modes)
    assert [mode for mode in TORCH_COMPILE_MODES if torch_modes[mode].get("triton.cudagraphs")] == []
    assert all(torch_modes[mode].get("triton.cudagraphs") for mode in CUDA_GRAPH_COMPILE_MODES)


@pytest.mark.parametrize("mode", TORCH_COMPILE_MODES)
def test_an_allowed_mode_stands_for_torchs_inductor_options(mode: str) -> None:
    from torch._inductor import list_mode_options

    assert inductor_mode_options(mode) == list_mode_options(mode)
    assert inductor_mode_options(None) == {}
    assert inductor_mode_options("max-autotune-no-cudagraphs")["max_autotune"] is True


@pytest.mark.parametrize(("mode", "why"), [("max-autotune", "captures its own CUDA graphs"), ("fast", "unknown")])
def test_a_refused_mode_is_a_config_error_naming_the_allowed_ones(mode: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as raised:
        inductor_mode_options(mode, "compile_mode")
    assert str(raised.value).startswith("compile_mode: ") and str(raised.value).endswith(
        "allowed: " + ", ".join(TORCH_COMPILE_MODES)
    )
