"""The Triton kernel set under ``torch.compile``: its custom ops (``torch.ops.cudagraph_triton``) against the eager
functions they stand for (``torch.library.opcheck``: schema, fake tensors, AOT dispatch; and the values), a whole
forward over the set traced into one graph for every token count with the ops as its nodes, the ``tc_piecewise``
split of it, and eager steps that never reach the ops. The ops on the GPU where there is one, else on CPU tensors
through Triton's interpreter (``TRITON_INTERPRET=1``, set by ``tests/conftest.py``); the forwards on CPU under the
interpreter only (``tests/gpu/backend/test_tc_piecewise_gpu.py`` runs them on CUDA); float32.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo
import torch.fx.experimental._config as fx_config
from test_traced_forward import assert_compiled_matches_eager, decode_batch, run_hidden
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton", reason="triton is not installed: pip install triton (CUDA builds of torch bring it)")

from inductor_cpu import needs_cxx

from cudagraph.backend import PiecewiseCompiler
from cudagraph.config import resolve
from cudagraph.engine.attention import TorchAttentionBackend
from cudagraph.engine.kernels import QKHeads, RotaryStep
from cudagraph.engine.kernels.rotary import rotary_cos_sin_halves_table
from cudagraph.engine.kernels.triton import ops as triton_ops
from cudagraph.engine.kernels.triton import traced_ops
from cudagraph.engine.kernels.triton.layer_set import TritonKernels
from cudagraph.engine.model import model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PRESETS = (
    "tiny-qwen3-random",
    pytest.param("tiny-llama-random", marks=pytest.mark.slow),  # the interpreter is slow: Qwen3's head norms in `tests`
)
TOKEN_COUNTS = (4, 1, 2)
"""The first compiles (its token dimension marked dynamic); 1 and 2 take the ``gemv`` kernels, 4 cuBLAS."""
OP_NAMESPACE = "cudagraph_triton"


pytestmark = pytest.mark.usefixtures("interpreter_or_gpu", "fresh_dynamo")


def randn(*shape: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=generator).to(DEVICE)


def rotary_inputs(tokens: int, generator: torch.Generator) -> tuple[torch.Tensor, QKHeads, RotaryStep]:
    """Heads ``[T, Hq + 2 Hk, D]`` of a tiny Qwen3 shape, its q/k norm and the rotary step at random positions."""
    config = model_config_from_preset("tiny-qwen3-random")
    num_q, num_k, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
    heads = randn(tokens, num_q + 2 * num_k, head_dim, generator=generator)
    norm_weight = 1 + 0.1 * randn(num_q + num_k, head_dim, generator=generator)
    table = rotary_cos_sin_halves_table(config, torch.device(DEVICE))
    positions = torch.randint(0, 30, (tokens,), generator=generator).to(DEVICE)
    return heads, QKHeads(num_q, num_k, norm_weight, 1e-6), RotaryStep(table, positions)


def op_cases(rows: int, generator: torch.Generator) -> list[tuple[str, tuple[Any, ...]]]:
    """Each op with arguments for a step of ``rows`` rows (the ``gemv`` kernels at 1 and 2 rows, cuBLAS above)."""
    width, out, inner = 48, 40, 24  # widths that are not powers of two: the masked tails count
    x, residual = randn(rows, width, generator=generator), randn(rows, width, generator=generator)
    norm_weight = 1 + 0.1 * randn(width, generator=generator)
    weight, bias = randn(out, width, generator=generator), randn(out, generator=generator)
    gate_up, down = randn(rows, 2 * inner, generator=generator), randn(out, inner, generator=generator)
    heads, (num_q, num_k, head_weight, eps), (table, positions) = rotary_inputs(rows, generator)
    kv_buffer = torch.zeros((16, 2, num_k, heads.shape[-1]), device=DEVICE)
    slots = torch.randperm(16, generator=generator)[:rows].to(DEVICE)
    rotary = (heads, head_weight, num_q, num_k, eps, table, positions)
    return [
        ("rms_norm", (x, norm_weight, 1e-6)),
        ("add_rms_norm", (x, residual, norm_weight, 1e-6)),
        ("linear", (x, weight, bias)),
        ("linear", (x, weight, None)),
        ("silu_mul_linear", (gate_up, down)),
        ("add_norm_linear", (x, residual, norm_weight, 1e-6, weight, bias)),
        ("norm_rotate", rotary),
        ("norm_rotate", (heads, None, num_q, num_k, eps, table, positions)),
        ("norm_rotate_store", (*rotary, kv_buffer, slots)),
    ]


@pytest.mark.parametrize("rows", [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(5, marks=pytest.mark.slow)])
def test_every_op_passes_opcheck(rows: int) -> None:
    """Schema (what it mutates), fake implementation (shapes, dtypes, strides of the real outputs) and AOT dispatch,
    for every op at the kernels' row counts."""
    generator = torch.Generator().manual_seed(rows)
    for name, args in op_cases(rows, generator):
        _, op = traced_ops.TRACED_OPS[name]
        torch.library.opcheck(op, args)


def _clone_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(arg.clone() if isinstance(arg, torch.Tensor) else arg for arg in args)


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_the_ops_compute_what_the_eager_functions_compute_and_write_only_what_they_declare(rows: int) -> None:
    """The op (new tensors, inputs untouched but the declared cache) against the eager function (in place)."""
    generator = torch.Generator().manual_seed(10 + rows)
    cases = {name: args for name, args in op_cases(rows, generator)}  # the last case of each name

    def check(name: str, eager: Callable[..., Any]) -> None:
        args = cases[name]
        before = _clone_args(args)
        got = getattr(torch.ops.cudagraph_triton, name)(*args)
        expected = eager(*_clone_args(args))
        for index, (arg, kept) in enumerate(zip(args, before, strict=True)):
            if isinstance(arg, torch.Tensor):
                assert torch.equal(arg, kept), f"{name} wrote its argument {index}"
        got_list = list(got) if isinstance(got, tuple) else [got]
        expected_list = list(expected) if isinstance(expected, tuple) else [expected]
        for have, want in zip(got_list, expected_list, strict=True):
            assert have.is_contiguous()
            torch.testing.assert_close(have, want, atol=1e-5, rtol=1e-5)

    check("rms_norm", triton_ops.rms_norm)
    check("add_rms_norm", triton_ops.add_rms_norm)
    check("linear", traced_ops.linear)
    check("silu_mul_linear", traced_ops.silu_mul_linear)
    check("add_norm_linear", traced_ops.add_norm_linear)

    heads, weight, num_q, num_k, eps, table, positions, kv_buffer, slots = cases["norm_rotate_store"]
    eager_heads, eager_kv = heads.clone(), kv_buffer.clone()
    rotated = traced_ops.norm_rotate(
        eager_heads, QKHeads(num_q, num_k, weight, eps), RotaryStep(table, positions), (eager_kv, slots)
    )
    heads_before = heads.clone()
    got = torch.ops.cudagraph_triton.norm_rotate_store(*cases["norm_rotate_store"])
    assert torch.equal(heads, heads_before), "the op reads the heads and writes its rotated ones to a new tensor"
    assert got.is_contiguous() and got.shape == rotated.shape
    torch.testing.assert_close(got, rotated, atol=0, rtol=0)
    torch.testing.assert_close(kv_buffer, eager_kv, atol=0, rtol=0)
    assert kv_buffer[slots].abs().sum() > 0, "the op wrote the keys and values it declares it mutates"

    # The storing-free op (the traced forward's: the attention op stores) copies the v heads after the rotated ones,
    # so the keys and values it returns sit side by side.
    heads, weight, num_q, num_k, eps, table, positions = cases["norm_rotate"]
    rotated = traced_ops.norm_rotate(
        heads.clone(), QKHeads(num_q, num_k, weight, eps), RotaryStep(table, positions), None
    )
    heads_before = heads.clone()
    got = torch.ops.cudagraph_triton.norm_rotate(*cases["norm_rotate"])
    assert torch.equal(heads, heads_before)
    assert got.is_contiguous() and got.shape == (rows, num_q + 2 * num_k, heads.shape[2])
    torch.testing.assert_close(got[:, : num_q + num_k], rotated, atol=0, rtol=0)
    torch.testing.assert_close(got[:, num_q + num_k :], heads[:, num_q + num_k : num_q + 2 * num_k], atol=0, rtol=0)


def triton_runner(preset: str, num_layers: int | None = None) -> ModelRunner:
    """A CPU engine on the Triton set (the decode batches of ``test_traced_forward`` are CPU tensors): only under the
    interpreter; on a GPU machine ``tests/gpu/backend/test_tc_piecewise_gpu.py`` runs the forward instead."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("a CPU forward over the Triton set runs under TRITON_INTERPRET=1 only (the GPU tests cover CUDA)")
    torch.manual_seed(0)
    config = model_config_from_preset(preset)
    if num_layers is not None:
        config = dataclasses.replace(config, num_layers=num_layers)
    runner = ModelRunner(
        random_model(config),
        resolve(),
        cache_config=CacheConfig(max_num_reqs=8, max_context_len=32),
        kernel_backend="torch",
    )
    runner.use_kernels(TritonKernels())
    return runner


class OpRecorder(TorchDispatchMode):
    """Every operator that reaches the dispatcher, by its namespace."""

    def __init__(self) -> None:
        super().__init__()
        self.namespaces: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.namespaces.add(func.namespace)
        return func(*args, **(kwargs or {}))


def graph_ops(graph_module: torch.fx.GraphModule) -> list[str]:
    return [str(node.target) for node in graph_module.graph.nodes if node.op == "call_function"]


@pytest.mark.slow  # deep: a whole forward traced per token count; each op's tracing is checked fast above
@pytest.mark.parametrize("preset", PRESETS)
def test_a_forward_over_the_triton_set_traces_into_one_graph_for_every_token_count(preset: str) -> None:
    """No graph break, one compilation for three token counts (the kernels are chosen inside the ops, so the graph
    does not branch on the rows), the custom ops as its nodes, and eager's numbers and cache."""
    runner = triton_runner(preset)
    graphs: list[torch.fx.GraphModule] = []

    def record(graph_module: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        graphs.append(graph_module)
        return graph_module

    compiled = torch.compile(runner.model_forward, backend=record, fullgraph=True)
    assert_compiled_matches_eager(runner, compiled, TOKEN_COUNTS)
    assert dict(counters["graph_break"]) == {}
    assert len(graphs) == 1 and counters["stats"]["unique_graphs"] == 1
    targets = graph_ops(graphs[0])
    num_layers = runner.model.config.num_layers
    # Per layer: add_norm_linear twice (the first layer's input norm is rms_norm and linear), linear for the output
    # projection, silu_mul_linear; and the final add_rms_norm. Rotary is inside the attention op, which stores the
    # keys and values in the rotary launch (as eager does), so no rotary op of the set is traced.
    assert not any(target.startswith(f"{OP_NAMESPACE}.norm_rotate") for target in targets)
    assert targets.count(f"{OP_NAMESPACE}.silu_mul_linear") == num_layers
    assert targets.count(f"{OP_NAMESPACE}.add_norm_linear") == 2 * num_layers - 1
    assert targets.count(f"{OP_NAMESPACE}.add_rms_norm") == 1
    assert targets.count("cudagraph_engine.rotate_store_attention") == num_layers
    assert targets.count("cudagraph_engine.unified_attention") == 0


@pytest.mark.slow  # deep: aot_autograd over a whole traced forward
@pytest.mark.parametrize("preset", PRESETS)
def test_aot_autograd_functionalizes_the_traced_forward_and_keeps_eagers_numbers(preset: str) -> None:
    """``aot_eager``: the ops' schemas and fake implementations hold through AOTAutograd's functionalization (what
    inductor compiles from)."""
    runner = triton_runner(preset)
    compiled = torch.compile(runner.model_forward, backend="aot_eager", fullgraph=True)
    assert_compiled_matches_eager(runner, compiled, (3, 1))
    assert counters["stats"]["unique_graphs"] == 1


def test_eager_steps_never_reach_the_custom_ops() -> None:
    """Eager forwards launch through FastLauncher: no ``cudagraph_triton`` op reaches the dispatcher (only the
    buffers' allocations and the torch attention backend's ops do)."""
    runner = triton_runner("tiny-qwen3-random")
    for tokens in (1, 5):
        batch = decode_batch(runner, tokens)
        with OpRecorder() as recorder:
            run_hidden(runner, batch, runner.model_forward)
        assert OP_NAMESPACE not in recorder.namespaces
        assert "cudagraph_engine" in recorder.namespaces  # the recorder does see custom ops
        for row in batch.req_pool_indices.tolist():
            runner.req_to_token_pool.free(row)


def test_the_split_forward_over_the_triton_set_has_one_piece_per_layer_and_every_layer_piece_is_the_same() -> None:
    """``tc_piecewise``'s split: attention stays the only split, and the pieces between two attention calls differ
    in nothing but their weights (the ops take no layer index), so one compiled piece serves every layer."""
    runner = triton_runner("tiny-qwen3-random", num_layers=4)
    compiler = PiecewiseCompiler("eager")
    compiled = torch.compile(runner.model_forward, backend=compiler, fullgraph=True)
    batch = decode_batch(runner, 3)
    torch._dynamo.mark_dynamic(batch.input_ids, 0)
    torch._dynamo.mark_dynamic(batch.positions, 0)
    with fx_config.patch(backed_size_oblivious=True):
        got = run_hidden(runner, batch, compiled)
    assert compiler.split is not None and compiler.stats.split_ops == 4
    pieces = [getattr(compiler.split.module, name) for name in compiler.split.piece_names]
    assert len(pieces) == 5
    structures = [
        [(node.op, "input" if node.op == "placeholder" else str(node.target)) for node in piece.graph.nodes]
        for piece in pieces[1:-1]
    ]
    assert all(structure == structures[0] for structure in structures[1:])
    assert any(target.startswith(f"{OP_NAMESPACE}.") for _, target in structures[0])
    assert torch.isfinite(got).all()


@pytest.mark.slow  # inductor compiles the whole CPU forward: about a minute on a 2-core machine (`nox -s slow`)
@needs_cxx
def test_a_whole_forward_compiled_by_inductor_rotates_and_stores_in_the_attention_op_as_eager_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Inductor over the whole forward (the compiled small buckets of ``full``): the attention op, a fallback there,
    rotates the heads it is given in place and stores in that launch; eager's numbers and cache, no pool store."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    runner = triton_runner("tiny-qwen3-random", num_layers=2)
    stored = record_pool_stores(monkeypatch, runner)
    compiled = torch.compile(runner.model_forward, backend="inductor", fullgraph=True)
    assert_compiled_matches_eager(runner, compiled, (3, 1))
    assert stored == []


def record_pool_stores(monkeypatch: pytest.MonkeyPatch, runner: ModelRunner) -> list[int]:
    """The layers whose keys and values go through the KV pool's own store (``TokenToKVPool.store``), recorded."""
    pool = runner.token_to_kv_pool
    stored: list[int] = []
    real_store = type(pool).store

    def record(self: object, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        stored.append(layer_id)
        real_store(self, layer_id, slots, k, v)  # type: ignore[arg-type]

    monkeypatch.setattr(type(pool), "store", record)
    return stored


def test_the_split_forward_stores_keys_and_values_in_the_rotary_launch_as_eager_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The compiled forward's attention op rotates and stores in one rotary launch (the eager Triton set's kernel with
    the backend's destination), so the KV pool's own store never runs, and the cache equals eager's."""
    runner = triton_runner("tiny-qwen3-random", num_layers=3)
    stored = record_pool_stores(monkeypatch, runner)
    compiled = torch.compile(runner.model_forward, backend=PiecewiseCompiler("eager"), fullgraph=True)
    assert_compiled_matches_eager(runner, compiled, (3,))
    assert stored == []


def test_the_attention_op_rotates_then_stores_apart_where_the_backend_names_no_destination(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An attention backend without ``kv_destination``: the op rotates in place, then the backend stores the keys and
    values (one pool store a layer), and the forward still equals eager, cache included."""
    runner = triton_runner("tiny-qwen3-random", num_layers=3)
    monkeypatch.delattr(TorchAttentionBackend, "kv_destination")
    assert not hasattr(runner.attn_backend, "kv_destination")
    stored = record_pool_stores(monkeypatch, runner)
    compiled = torch.compile(runner.model_forward, backend=PiecewiseCompiler("eager"), fullgraph=True)
    assert_compiled_matches_eager(runner, compiled, (3,))
    assert stored == [0, 1, 2] * 2  # the compiled forward's stores, then the eager reference's


def test_a_recorded_split_step_rotates_and_stores_in_its_segments_and_only_attends_at_the_split(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At a ``tc_piecewise`` recording the op's capture prefix rotates and stores each layer's heads in the segment
    before its split (one launch), so every split call only attends (``rotated=True``); a replay with new tokens
    equals eager, cache included, and nothing calls the KV pool's store."""
    from piecewise_recording import assert_replay_with_new_tokens_equals_eager, record_step

    from cudagraph.backend_utils import ShapeDescriptor

    runner = triton_runner("tiny-qwen3-random", num_layers=3)
    stored = record_pool_stores(monkeypatch, runner)
    batch = decode_batch(runner, 3)
    kv_before = [kv.clone() for kv in runner.token_to_kv_pool.kv_buffer]
    sequence, output = record_step(runner, batch, ShapeDescriptor.decode(3))
    assert sequence.prefixes == len(sequence.split_calls) == 3
    assert all(call.kwargs.get("rotated") is True for call in sequence.split_calls)
    assert_replay_with_new_tokens_equals_eager(runner, batch, sequence, output, kv_before, torch.tensor([5, 11, 2]))
    assert stored == []


@pytest.mark.slow  # inductor compiles three CPU pieces: about 40 s on a 2-core machine (`nox -s slow`)
@needs_cxx
def test_inductor_compiles_around_the_ops_once_and_keeps_eagers_numbers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Inductor's pieces call the ops (it compiles the glue between them): one compilation for three token counts,
    one layer piece compiled and shared, eager's numbers and cache."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    runner = triton_runner("tiny-qwen3-random", num_layers=3)
    compiler = PiecewiseCompiler("inductor")
    compiled = torch.compile(runner.model_forward, backend=compiler, fullgraph=True)
    assert_compiled_matches_eager(runner, compiled, (4, 1, 2))
    assert counters["stats"]["unique_graphs"] == 1 and dict(counters["graph_break"]) == {}
    assert compiler.stats.pieces == 4
    assert (compiler.stats.pieces_compiled, compiler.stats.pieces_reused) == (3, 1)
