"""tc_piecewise without CUDA: the engine's forward split at the attention op runs piece by piece (eagerly) and equals
the eager forward; one piece more than attention calls; no graph breaks; one compilation for every token count."""

from __future__ import annotations

import dataclasses
from contextvars import ContextVar
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch.fx.experimental._config as fx_config
from inductor_cpu import needs_cxx
from piecewise_recording import assert_replay_with_new_tokens_equals_eager, record_step
from test_traced_forward import decode_batch, make_runner, run_hidden
from torch._dynamo.utils import counters

from cudagraph.backend import ModelTraceError, PiecewiseCompiler, split_at_split_ops
from cudagraph.backend.compile_forward import is_trace_error, trace_error
from cudagraph.config import resolve
from cudagraph.engine.attention.op import unified_attention
from cudagraph.engine.model import model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner

PRESETS = ("tiny-qwen3-random", "tiny-llama-random", "tiny-qwen3-moe-random")

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # dynamo reset between tests (conftest.py)


@pytest.mark.parametrize("preset", PRESETS)
def test_the_split_forward_has_one_piece_per_attention_call_plus_one_and_equals_eager(preset: str) -> None:
    runner = make_runner(preset)
    calls: list[int] = []

    def wrap_piece(index: int, piece: object) -> object:
        def run(*args: object) -> object:
            calls.append(index)
            return piece(*args)  # type: ignore[operator]

        return run

    compiler = PiecewiseCompiler("eager", wrap_piece=wrap_piece)
    compiled = torch.compile(runner.model_forward, backend=compiler, fullgraph=True)
    num_layers = runner.model.config.num_layers
    for index, batch_size in enumerate((4, 1, 6)):
        batch = decode_batch(runner, batch_size)
        if index == 0:
            torch._dynamo.mark_dynamic(batch.input_ids, 0)
            torch._dynamo.mark_dynamic(batch.positions, 0)
        kv_before = [kv.clone() for kv in runner.token_to_kv_pool.kv_buffer]
        calls.clear()
        with fx_config.patch(backed_size_oblivious=True):
            got = run_hidden(runner, batch, compiled)
        assert calls == list(range(num_layers + 1))  # every piece, in order, once
        for kv, before in zip(runner.token_to_kv_pool.kv_buffer, kv_before, strict=True):
            kv.copy_(before)
        torch.testing.assert_close(got, run_hidden(runner, batch, runner.model_forward), atol=1e-5, rtol=1e-5)
        for row in batch.req_pool_indices.tolist():
            runner.req_to_token_pool.free(row)
    assert compiler.stats.pieces == compiler.stats.split_ops + 1 == num_layers + 1
    assert compiler.stats.compilations == 1 and compiler.stats.recompiles == 0
    assert dict(counters["graph_break"]) == {}
    assert compiler.split is not None
    split_targets = [
        node.target
        for name in compiler.split.split_names
        for node in getattr(compiler.split.module, name).graph.nodes
        if node.op == "call_function"
    ]
    assert split_targets and all(getattr(t, "overloadpacket", t) is unified_attention for t in split_targets)


def test_a_graph_without_split_ops_is_one_piece() -> None:
    graph_module = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    split = split_at_split_ops(graph_module)
    assert len(split.piece_names) == 1 and split.split_names == ()
    x = torch.randn(2, 4)
    torch.testing.assert_close(split.module(x), graph_module(x))


def test_an_unknown_compiler_is_a_config_error() -> None:
    from cudagraph.config import ConfigError

    with pytest.raises(ConfigError, match="eager, inductor"):
        PiecewiseCompiler("tvm")


_STEP: ContextVar[float] = ContextVar("test_step", default=1.0)


def _untraceable(x: torch.Tensor) -> torch.Tensor:
    return x + _STEP.get()  # per-step state read in traced Python: what the attention op must hide


def test_a_forward_that_does_not_trace_names_the_function_the_line_and_the_reason() -> None:
    compiled = torch.compile(_untraceable, backend=PiecewiseCompiler("eager"), fullgraph=True)
    with pytest.raises(Exception) as raised:  # which dynamo error it is depends on the torch version
        compiled(torch.ones(3))
    assert is_trace_error(raised.value)
    error = trace_error(_untraceable, raised.value)
    assert isinstance(error, ModelTraceError)
    message = str(error)
    assert "_untraceable" in message and "test_tc_piecewise_split.py:" in message
    assert "breakable backend" in message


@pytest.mark.parametrize("mode", [None, "max-autotune-no-cudagraphs", "lite"])
def test_inductor_pieces_compile_with_the_modes_options(monkeypatch: pytest.MonkeyPatch, mode: str | None) -> None:
    import torch._inductor.compile_fx
    from torch._inductor import list_mode_options

    given: list[object] = []

    def record_compile_fx(piece: torch.fx.GraphModule, inputs: list[object], **kwargs: object) -> object:
        given.append(kwargs.get("config_patches"))
        return piece  # run as traced: what is checked is what inductor was asked for

    monkeypatch.setattr(torch._inductor.compile_fx, "compile_fx", record_compile_fx)
    compiler = PiecewiseCompiler("inductor", mode=mode)
    compiled = torch.compile(lambda x: x.sin() + 1, backend=compiler, fullgraph=True)
    torch.testing.assert_close(compiled(torch.ones(3)), torch.ones(3).sin() + 1)
    assert compiler.stats.pieces == 1
    assert given == [list_mode_options(mode) if mode else {}]


def test_a_mode_with_its_own_cuda_graphs_is_refused_by_the_piecewise_compiler() -> None:
    from cudagraph.config import ConfigError

    with pytest.raises(ConfigError, match="'reduce-overhead' captures its own CUDA graphs"):
        PiecewiseCompiler("inductor", mode="reduce-overhead")


def _structure(piece: torch.fx.GraphModule) -> list[tuple[object, ...]]:
    """A piece's graph with node names left out: op kind, target and arguments (other nodes by position)."""
    position = {node: index for index, node in enumerate(piece.graph.nodes)}

    def shape_of(value: object) -> object:
        return ("node", position[value]) if isinstance(value, torch.fx.Node) else value

    return [
        (
            node.op,
            node.target if node.op != "placeholder" else "input",
            torch.fx.node.map_aggregate(node.args, shape_of),
        )
        for node in piece.graph.nodes
    ]


def _deep_runner(num_layers: int) -> ModelRunner:
    torch.manual_seed(0)
    config = dataclasses.replace(model_config_from_preset("tiny-qwen3-random"), num_layers=num_layers)
    return ModelRunner(random_model(config), resolve(), cache_config=CacheConfig(max_num_reqs=8, max_context_len=32))


def _compile_split(runner: ModelRunner, compiler: PiecewiseCompiler) -> torch.Tensor:
    compiled = torch.compile(runner.model_forward, backend=compiler, fullgraph=True)
    batch = decode_batch(runner, 4)
    torch._dynamo.mark_dynamic(batch.input_ids, 0)
    torch._dynamo.mark_dynamic(batch.positions, 0)
    with fx_config.patch(backed_size_oblivious=True):
        return run_hidden(runner, batch, compiled)


def test_every_piece_between_two_attention_calls_is_the_same_graph() -> None:
    """The layer reaches only the attention call (a split op), so the pieces of layers 1..n-1 differ in nothing but
    the weights they are given: the condition for inductor to compile one and serve the rest from its cache."""
    runner = _deep_runner(num_layers=5)
    compiler = PiecewiseCompiler("eager")
    _compile_split(runner, compiler)
    assert compiler.split is not None
    pieces = [getattr(compiler.split.module, name) for name in compiler.split.piece_names]
    assert len(pieces) == 6
    middle = [_structure(piece) for piece in pieces[1:-1]]
    assert all(structure == middle[0] for structure in middle[1:])
    assert _structure(pieces[0]) != middle[0]  # the embedding piece is another graph: the comparison can tell


@pytest.mark.slow  # a real inductor compile of three pieces: about 20 s on a 2-core machine (`nox -s slow`)
@needs_cxx
def test_inductor_compiles_the_repeated_layer_piece_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))  # a cold cache
    counters.clear()
    runner = _deep_runner(num_layers=4)
    compiler = PiecewiseCompiler("inductor")
    got = _compile_split(runner, compiler)
    assert compiler.stats.pieces == 5
    # Compiled: the embedding piece, the first layer piece, the last piece; the other layer pieces share the first
    # layer's compiled callable, so they cost neither a compile nor a cache lookup.
    assert (compiler.stats.pieces_compiled, compiler.stats.pieces_reused) == (3, 2)
    assert counters["inductor"]["fxgraph_cache_miss"] == 3
    assert counters["inductor"]["fxgraph_cache_hit"] == 0
    assert compiler.stats.cache_dir == str((tmp_path / "inductor-cache").resolve())
    assert torch.isfinite(got).all()


@pytest.mark.parametrize("preset", PRESETS)
def test_a_recorded_step_stores_kv_in_its_segments_and_only_attends_at_the_split(preset: str) -> None:
    """The attention op's capture prefix stores each layer's keys and values in the segment before its split, so the
    replayed split calls only attend (``kv_stored=True``), and a replay with new tokens equals eager, cache included."""
    from cudagraph.backend_utils import ShapeDescriptor

    runner = make_runner(preset)
    batch = decode_batch(runner, 3)
    kv_before = [kv.clone() for kv in runner.token_to_kv_pool.kv_buffer]
    sequence, output = record_step(runner, batch, ShapeDescriptor.decode(3))
    num_layers = runner.model.config.num_layers
    assert sequence.prefixes == len(sequence.split_calls) == num_layers
    assert all(call.kwargs.get("kv_stored") is True for call in sequence.split_calls)

    # New tokens in the static input, the cache as it was before the step: the replay must store and attend anew.
    assert_replay_with_new_tokens_equals_eager(runner, batch, sequence, output, kv_before, torch.tensor([5, 11, 2]))
