"""``CudaGraphConfig.model_forward_compiler``: the one rule for whether a graph runs the model forward compiled
(dynamo traces it: the engine's kernel choice) and whether inductor compiles it (the compile settings are used)."""

from __future__ import annotations

import pytest

from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig, resolve


def config(decode: Backend, prefill: Backend, *, compiler: str = "eager", compiled_bs: int = 0) -> CudaGraphConfig:
    return CudaGraphConfig(
        decode=PhaseConfig(decode, () if decode is Backend.DISABLED else (1, 2), 2),
        prefill=PhaseConfig(prefill, () if prefill is Backend.DISABLED else (16,), 16),
        tc_piecewise_compiler=compiler,
        torch_compile_max_bs=compiled_bs,
    )


@pytest.mark.parametrize(
    ("graphs", "compiler"),
    [
        (config(Backend.FULL, Backend.BREAKABLE), None),
        (config(Backend.DISABLED, Backend.DISABLED), None),
        (config(Backend.FULL, Backend.BREAKABLE, compiler="inductor"), None),
        (config(Backend.FULL, Backend.TC_PIECEWISE), "eager"),
        (config(Backend.TC_PIECEWISE, Backend.DISABLED, compiler="inductor"), "inductor"),
        (config(Backend.FULL, Backend.BREAKABLE, compiled_bs=8), "inductor"),
        (config(Backend.FULL, Backend.TC_PIECEWISE, compiled_bs=8), "inductor"),
        (config(Backend.DISABLED, Backend.BREAKABLE, compiled_bs=8), None),
    ],
    ids=[
        "full-breakable",
        "disabled",
        "inductor-unused",
        "tc_piecewise-eager",
        "tc_piecewise-inductor",
        "compiled-small-buckets",
        "both",
        "compiled-buckets-without-full-decode",
    ],
)
def test_which_compiler_the_model_forward_goes_through(graphs: CudaGraphConfig, compiler: str | None) -> None:
    assert graphs.model_forward_compiler == compiler


@pytest.mark.parametrize(
    ("settings", "used"),
    [
        ({"torch_compile_max_bs": 8}, True),
        ({"prefill_cuda_graph_backend": "tc_piecewise", "tc_piecewise_compiler": "inductor"}, True),
        ({"prefill_cuda_graph_backend": "tc_piecewise"}, False),
        ({}, False),
    ],
)
def test_resolve_marks_the_compile_mode_unused_by_the_same_rule(settings: dict[str, object], used: bool) -> None:
    resolved = resolve(torch_compile_mode="max-autotune-no-cudagraphs", **settings)
    assert (resolved.model_forward_compiler == "inductor") is used
    assert resolved.torch_compile_mode == "max-autotune-no-cudagraphs"
    assert ("unused: nothing compiles with inductor" in resolved.sources["torch_compile_mode"]) is not used
