"""The Triton set's fused LoRA delta (``kernels.triton.lora``): the two kernels against the adapters' torch reference
(``lora.add_lora_delta``) at every tile and over row bounds that are not block aligned, its custom op
(``torch.ops.cudagraph_triton.lora_delta``: opcheck, and it writes ``out`` only), the choice of path by the layer's
kernel set, and forwards with adapters on over the Triton set: eager against the torch set's, traced (one graph,
the op its node), split as ``tc_piecewise`` splits it, and compiled by inductor piece by piece (these three slow).
On the GPU where there is one, else on CPU tensors through Triton's interpreter (``TRITON_INTERPRET=1``, set by
``tests/conftest.py``); the forwards on CPU under the interpreter only (``tests/gpu/engine/test_gpu_lora_kernels.py``
runs bfloat16 and the graphs on CUDA).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
import torch._dynamo
from test_traced_forward import assert_compiled_matches_eager, decode_batch, run_hidden
from torch._dynamo.utils import counters

pytest.importorskip("triton", reason="triton is not installed: pip install triton (CUDA builds of torch bring it)")

from inductor_cpu import needs_cxx
from lora_factors import random_lora_adapter

from cudagraph.backend import PiecewiseCompiler
from cudagraph.config import resolve
from cudagraph.engine.kernels import TORCH_KERNELS
from cudagraph.engine.kernels.triton import lora as triton_lora
from cudagraph.engine.kernels.triton import traced_ops
from cudagraph.engine.kernels.triton.layer_set import TritonKernels
from cudagraph.engine.lora import LORA_TARGETS, LoraConfig, ProjectionSlots, add_delta, add_lora_delta
from cudagraph.engine.lora import apply as lora_apply
from cudagraph.engine.model import model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: {"atol": 1e-4, "rtol": 1e-4}}
ROUNDING = {torch.float32: 1e-5, torch.float16: 4e-3}
"""A delta's error bound, relative to the largest output value."""
LAYOUTS = {
    "q/k/v, rows not block aligned": ((0, 40), (40, 52), (52, 64)),
    "q and v, k rows between untouched": ((2, 21), (37, 50)),
    "o": ((0, 72),),
}
"""Per target, the ``(start, stop)`` rows of an 80-row output it adds to."""
TOKENS = (1, 7, 20, 70)
"""Each tile of ``LORA_TILES`` (16, 64 and beyond), with token counts that are not multiples of the blocks."""


pytestmark = pytest.mark.usefixtures("interpreter_or_gpu", "fresh_dynamo")


@dataclasses.dataclass
class DeltaCase:
    """One projection's slot tensors (the ``AdapterSlots`` layout), a step's inputs and its scales."""

    projection: ProjectionSlots
    x: torch.Tensor
    out: torch.Tensor
    scales: torch.Tensor

    def fused_args(self, out: torch.Tensor) -> tuple[object, ...]:
        projection = self.projection
        return (out, self.x, projection.a, projection.b, self.scales, projection.rows)


def delta_case(
    rows: tuple[tuple[int, int], ...], tokens: int, dtype: torch.dtype, seed: int, slots: int = 3, rank: int = 4
) -> DeltaCase:
    """Random factors for ``slots`` slots of ``rank`` (B zeros outside each target's rows and column block, as
    ``AdapterSlots`` keeps it), tokens through every slot and the no-adapter row."""
    generator = torch.Generator().manual_seed(seed)
    in_features = 48
    row_start, row_stop = min(start for start, _ in rows), max(stop for _, stop in rows)
    a = torch.randn((len(rows), slots, rank, in_features), generator=generator)
    b = torch.zeros((row_stop - row_start, len(rows), slots, rank))
    for target, (start, stop) in enumerate(rows):
        b[start - row_start : stop - row_start, target] = torch.randn((stop - start, slots, rank), generator=generator)
    table = torch.zeros((slots + 1, slots * rank))
    for slot in range(slots):
        table[slot, slot * rank : (slot + 1) * rank] = 0.5 + slot
    indices = (torch.arange(tokens) % (slots + 1))[torch.randperm(tokens, generator=generator)]  # slot 0 at T=1
    names = ("q_proj", "k_proj", "v_proj") if len(rows) > 1 else ("o_proj",)
    projection = ProjectionSlots(
        tuple(LORA_TARGETS[name] for name in names[: len(rows)]),
        a.to(DEVICE, dtype),
        b.to(DEVICE, dtype),
        rows,
    )
    x = torch.randn((tokens, in_features), generator=generator).to(DEVICE, dtype)
    out = torch.randn((tokens, 80), generator=generator).to(DEVICE, dtype)
    return DeltaCase(projection, x, out, table[indices].to(DEVICE, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_fused_delta_adds_what_the_torch_reference_adds(layout: str, tokens: int, dtype: torch.dtype) -> None:
    """Against the reference in float64 (the same factors), within the dtype's rounding of the largest value: the
    reference in the model dtype rounds the shrunk product twice where the kernels round it once, so on float16
    the two may differ by more than either differs from float64."""
    case = delta_case(LAYOUTS[layout], tokens, dtype, seed=tokens)
    exact = case.out.double()
    projection = case.projection
    exact_projection = dataclasses.replace(projection, a=projection.a.double(), b=projection.b.double())
    add_lora_delta(exact, case.x.double(), exact_projection, case.scales.double())
    got = case.out.clone()
    triton_lora.lora_delta(*case.fused_args(got))
    assert not torch.equal(exact, case.out.double())  # the case has a delta to add
    outside = torch.ones(80, dtype=torch.bool, device=DEVICE)
    for start, stop in LAYOUTS[layout]:
        outside[start:stop] = False
    assert torch.equal(got[:, outside], case.out[:, outside])  # rows of no target: untouched
    reference = case.out.clone()
    add_lora_delta(reference, case.x, projection, case.scales)
    bound = ROUNDING[dtype] * exact.abs().max().item()
    for have in (got, reference):
        torch.testing.assert_close(have.double(), exact, atol=bound, rtol=0)


def test_bad_factors_are_refused_naming_the_shapes() -> None:
    case = delta_case(LAYOUTS["o"], 2, torch.float32, seed=0)
    projection = case.projection
    with pytest.raises(ValueError, match="1 to 3 targets"):
        triton_lora.lora_delta(case.out, case.x, projection.a, projection.b, case.scales, ((0, 36), (36, 72)))
    with pytest.raises(ValueError, match=r"got a \(1, 3, 4, 48\), b \(72, 1, 3, 4\), scales \(2, 11\)"):
        triton_lora.lora_delta(case.out, case.x, projection.a, projection.b, case.scales[:, :11], projection.rows)


@pytest.mark.parametrize("tokens", [1, 5])
def test_the_op_passes_opcheck_and_writes_only_out(tokens: int) -> None:
    case = delta_case(LAYOUTS["q/k/v, rows not block aligned"], tokens, torch.float32, seed=tokens)
    flat_rows = [bound for pair in case.projection.rows for bound in pair]
    _, op = traced_ops.TRACED_OPS["lora_delta"]
    args = (case.out.clone(), case.x, case.projection.a, case.projection.b, case.scales, flat_rows)
    torch.library.opcheck(op, args)
    inputs = [tensor.clone() for tensor in args[1:5]]
    got = case.out.clone()
    torch.ops.cudagraph_triton.lora_delta(got, *args[1:5], flat_rows)
    for tensor, kept in zip(args[1:5], inputs, strict=True):
        assert torch.equal(tensor, kept)
    want = case.out.clone()
    triton_lora.lora_delta(*case.fused_args(want))
    torch.testing.assert_close(got, want, atol=0, rtol=0)


class RecordingTriton(TritonKernels):
    """The Triton set, counting its fused deltas."""

    def __init__(self) -> None:
        self.fused_calls = 0

    def lora_delta(self, *args: object) -> None:  # type: ignore[override]
        self.fused_calls += 1
        triton_lora.lora_delta(*args)  # type: ignore[arg-type]


def test_the_kernel_set_chooses_the_delta(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton set's ``lora_delta`` where the set has one; the torch reference for the torch set."""
    reference_calls: list[int] = []

    def recording_reference(*args: object) -> None:
        reference_calls.append(1)
        add_lora_delta(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(lora_apply, "add_lora_delta", recording_reference)
    assert TORCH_KERNELS.lora_delta is None and TritonKernels.lora_delta is triton_lora.lora_delta
    case = delta_case(LAYOUTS["o"], 3, torch.float32, seed=1)
    triton = RecordingTriton()
    fused, reference = case.out.clone(), case.out.clone()
    add_delta(triton, fused, case.x, case.projection, case.scales)
    assert (triton.fused_calls, len(reference_calls)) == (1, 0)
    add_delta(TORCH_KERNELS, reference, case.x, case.projection, case.scales)
    assert (triton.fused_calls, len(reference_calls)) == (1, 1)
    torch.testing.assert_close(fused, reference, **TOLERANCE[torch.float32])


def lora_runner(kernels: TritonKernels | None) -> ModelRunner:
    """A 2-layer tiny Qwen3 CPU engine with two random adapters of ranks 4 and 2 loaded, on ``kernels`` (None: the
    torch set): only under the interpreter (the GPU tests cover CUDA)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("a CPU forward over the Triton set runs under TRITON_INTERPRET=1 only (the GPU tests cover CUDA)")
    torch.manual_seed(0)
    config = dataclasses.replace(model_config_from_preset("tiny-qwen3-random"), num_layers=2)
    runner = ModelRunner(
        random_model(config),
        resolve(),
        cache_config=CacheConfig(max_num_reqs=8, max_context_len=32),
        kernel_backend="torch",
        lora_config=LoraConfig(max_loras=2, max_rank=4),
    )
    if kernels is not None:
        runner.use_kernels(kernels)
    generator = torch.Generator().manual_seed(5)
    for name, rank in (("a", 4), ("b", 2)):
        runner.load_lora_adapter(name, random_lora_adapter(config, rank, generator))
    return runner


def write_adapter_mix(runner: ModelRunner, tokens: int) -> None:
    """Tokens through adapter a, adapter b and none in turn: the step's indices written and its scales gathered."""
    assert runner.lora is not None
    runner.lora.write_step([("a", "b", None)[index % 3] for index in range(tokens)], [1] * tokens)
    runner.lora.step.gather_scales(tokens)


def decode_with_adapters(runner: ModelRunner, batch_size: int) -> object:
    """A decode batch whose tokens go through adapter a, adapter b and none in turn, its scales gathered."""
    write_adapter_mix(runner, batch_size)
    return decode_batch(runner, batch_size)


def test_the_layers_pass_their_kernel_set_and_the_fused_forward_matches_the_torch_sets() -> None:
    """A decode forward with adapters on: the Triton set computes every delta fused (two a layer), and its hidden
    states are the torch set's with the reference deltas (the base forward differs by float32 rounding only)."""
    triton = RecordingTriton()
    fused_runner, reference_runner = lora_runner(triton), lora_runner(None)
    hidden, batches = [], []
    for runner in (fused_runner, reference_runner):
        batches.append(decode_with_adapters(runner, 5))
        assert runner.lora is not None
        with runner.lora.step.applying():
            hidden.append(run_hidden(runner, batches[-1], runner.model_forward))
    assert triton.fused_calls == 2 * 2
    torch.testing.assert_close(hidden[0], hidden[1], atol=1e-4, rtol=1e-4)
    plain = run_hidden(fused_runner, batches[0], fused_runner.model_forward)  # the step's own KV rewritten first
    assert triton.fused_calls == 2 * 2
    assert not torch.allclose(plain, hidden[0], atol=1e-3)  # the adapters change the states


@pytest.mark.slow  # two compiles under the interpreter; the op's opcheck and the fused eager forward stay fast
def test_a_traced_forward_with_adapters_calls_the_op_and_keeps_eagers_numbers() -> None:
    """Dynamo meets ``lora.lora_delta`` and traces the custom op in its place (two nodes a layer, no graph break);
    ``aot_eager`` functionalizes its write to the projection and keeps eager's numbers and cache."""
    runner = lora_runner(TritonKernels())
    assert runner.lora is not None
    graphs: list[torch.fx.GraphModule] = []

    def record(graph_module: torch.fx.GraphModule, example_inputs: list[object]) -> object:
        graphs.append(graph_module)
        return graph_module

    write_adapter_mix(runner, 8)  # the scales of every batch below (its first rows)
    with runner.lora.step.applying():
        traced = torch.compile(runner.model_forward, backend=record, fullgraph=True)
        batch = decode_batch(runner, 3)
        run_hidden(runner, batch, traced)
        for row in batch.req_pool_indices.tolist():
            runner.req_to_token_pool.free(row)
        assert dict(counters["graph_break"]) == {} and len(graphs) == 1
        targets = [str(node.target) for node in graphs[0].graph.nodes if node.op == "call_function"]
        assert targets.count("cudagraph_triton.lora_delta") == 2 * 2
        torch._dynamo.reset()
        compiled = torch.compile(runner.model_forward, backend="aot_eager", fullgraph=True)
        assert_compiled_matches_eager(runner, compiled, (3, 1))


@pytest.mark.slow  # the traced forward with adapters (above), split as tc_piecewise splits it
def test_the_split_forward_with_adapters_keeps_the_deltas_in_the_pieces_and_eagers_numbers() -> None:
    """``tc_piecewise``'s split of a forward with adapters on: attention stays the only split, each projection's
    delta is a node of the piece it falls in (a layer's q/k/v delta before its attention, its o delta after), and the
    pieces, run one after another, give eager's numbers and cache."""
    runner = lora_runner(TritonKernels())
    assert runner.lora is not None
    compiler = PiecewiseCompiler("eager")
    compiled = torch.compile(runner.model_forward, backend=compiler, fullgraph=True)
    write_adapter_mix(runner, 8)
    with runner.lora.step.applying():
        assert_compiled_matches_eager(runner, compiled, (3, 1))
    assert compiler.split is not None and compiler.stats.split_ops == 2
    pieces = [getattr(compiler.split.module, name) for name in compiler.split.piece_names]
    deltas = [sum(str(node.target) == "cudagraph_triton.lora_delta" for node in piece.graph.nodes) for piece in pieces]
    assert deltas == [1, 2, 1]


@pytest.mark.slow  # inductor compiles three CPU pieces: about a minute on a 2-core machine (`nox -s slow`)
@needs_cxx
def test_inductor_compiles_the_pieces_around_the_delta_op_and_keeps_eagers_numbers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The op's write to the projection holds through inductor's functionalization (``mutates_args``): eager's
    numbers and cache from the compiled pieces."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    runner = lora_runner(TritonKernels())
    assert runner.lora is not None
    compiled = torch.compile(runner.model_forward, backend=PiecewiseCompiler("inductor"), fullgraph=True)
    write_adapter_mix(runner, 8)
    with runner.lora.step.applying():
        assert_compiled_matches_eager(runner, compiled, (3, 1))
