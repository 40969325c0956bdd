"""Compile every Triton kernel of the engine for a Hopper GPU (sm_90) without one, as each launcher would launch it
with programmatic dependent launch on or off, and report what the PTX does around the grid-dependency wait.

Run as a script (not under Triton's interpreter, whose kernels cannot be compiled): it records the launches the
engine's operations make on small CPU tensors (``FastLauncher`` patched to record, so nothing runs), compiles each
recorded launch through ``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` and prints one JSON object a launch.
``test_triton_pdl.py`` runs it; it also runs under another Triton release (``PYTHONPATH`` pointing at one), which is
how a release the GPU machines have is checked from here.

    python3 tests/engine_model/pdl_probe.py on|off
    PYTHONPATH=/path/to/triton-3.6 python3 tests/engine_model/pdl_probe.py on
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from cudagraph.backend_utils import FastLauncher
from cudagraph.engine.kernels.triton import decode_attention, extend_attention, lora, moe, ops

PDL_MODULES = (ops, decode_attention, extend_attention, lora, moe)
"""Every module of the package that launches kernels (each imports ``pdl_launch`` by name)."""

_TRITON_TYPES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
}


class Launch:
    """One recorded launch: the kernel and everything it was given."""

    def __init__(self, kernel: Any, args: tuple, constexprs: dict, num_warps: int, launch_pdl: bool) -> None:
        self.kernel, self.args, self.constexprs = kernel, args, dict(constexprs)
        self.num_warps, self.launch_pdl = num_warps, launch_pdl


def record_launches(pdl: bool) -> list[Launch]:
    """The launches the engine's operations make, each launcher asked for PDL answering ``pdl``."""
    launches: list[Launch] = []

    def call(self, grid, args, constexprs, num_warps=4, *, launch_pdl=False) -> None:
        launches.append(Launch(self.kernel, args, constexprs, num_warps, launch_pdl))

    def bind(self, grid, args, constexprs, num_warps=4, *, launch_pdl=False):
        call(self, grid, args, constexprs, num_warps, launch_pdl=launch_pdl)
        return lambda: None

    FastLauncher.__call__ = call  # type: ignore[method-assign]
    FastLauncher.bind = bind  # type: ignore[method-assign]
    for module in PDL_MODULES:
        module.pdl_launch = lambda device: pdl  # type: ignore[attr-defined]
    exercise()
    return launches


def exercise() -> None:
    """Every operation of the package once, on CPU tensors of a small model's shapes (bfloat16)."""
    dtype, hidden, heads, kv_heads, head_dim = torch.bfloat16, 256, 4, 2, 64
    x = torch.randn(1, hidden, dtype=dtype)
    norm_weight = torch.ones(hidden, dtype=dtype)
    ops.rms_norm(x, norm_weight, 1e-6)
    ops.add_rms_norm(x.clone(), x.clone(), norm_weight, 1e-6)
    weight = torch.randn(512, hidden, dtype=dtype)
    ops.gemv(x, weight)
    ops.add_norm_gemv(x, x.clone(), norm_weight, 1e-6, weight)
    ops.gemv(torch.randn(1, 2 * hidden, dtype=dtype), weight, silu_mul=True)
    ops.silu_and_mul(torch.randn(8, 2 * hidden, dtype=dtype))
    qkv = torch.randn(1, heads + 2 * kv_heads, head_dim, dtype=dtype)
    cos_sin = torch.randn(16, head_dim)
    positions = torch.zeros(1, dtype=torch.int64)
    kv_buffer = torch.zeros(8, 2, kv_heads, head_dim, dtype=dtype)
    ops.qk_norm_rope(
        qkv, torch.ones(heads + kv_heads, head_dim, dtype=dtype), heads, kv_heads, 1e-6, cos_sin, positions,
        (kv_buffer, positions),
    )  # fmt: skip
    req_to_token = torch.zeros(2, 16, dtype=torch.int32)
    q, out = torch.randn(1, heads * head_dim, dtype=dtype), torch.empty(1, heads * head_dim, dtype=dtype)
    rows = decode_attention.DecodeRows(torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.int32))
    decode = decode_attention.PagedDecodeKernel(heads, kv_heads, head_dim, 0.125, 16, torch.device("cpu"))
    decode(q, kv_buffer, out, req_to_token, rows)
    decode.bind(q, kv_buffer, out, req_to_token, rows)
    extend = extend_attention.PagedExtendKernel(heads, kv_heads, head_dim, 0.125)
    blocks = extend_attention.ExtendRows(
        torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
        torch.ones(1, dtype=torch.int32),
    )  # fmt: skip
    extend(q, kv_buffer, out, req_to_token, blocks)
    slots, rank = 2, 8
    lora.lora_delta(
        torch.zeros(1, 512, dtype=dtype), x, torch.randn(1, slots, rank, hidden, dtype=dtype),
        torch.randn(512, 1, slots, rank, dtype=dtype), torch.ones(1, slots * rank, dtype=dtype), [(0, 512)],
    )  # fmt: skip
    experts = torch.zeros(1, 2, dtype=torch.int64)
    moe.moe_experts(
        x, torch.full((1, 2), 0.5), experts, torch.randn(4, 128, hidden, dtype=dtype),
        torch.randn(4, hidden, 64, dtype=dtype), 0,
    )  # fmt: skip


def _type_of(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + _TRITON_TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {value!r}")


def compile_for_hopper(launch: Launch) -> dict[str, object]:
    """Compile ``launch`` for sm_90 and read its PTX: the grid-dependency instructions and the global loads, stores
    and atomics before the first wait."""
    kernel = launch.kernel
    names = list(kernel.arg_names)
    signature = {name: _type_of(value) for name, value in zip(names, launch.args, strict=False)}
    signature.update({name: "constexpr" for name in launch.constexprs})
    options = {"num_warps": launch.num_warps, **({"launch_pdl": True} if launch.launch_pdl else {})}
    compiled = triton.compile(
        ASTSource(kernel, signature, constexprs=launch.constexprs), target=GPUTarget("cuda", 90, 32), options=options
    )
    lines = [line.strip() for line in compiled.asm["ptx"].splitlines()]
    waits = [index for index, line in enumerate(lines) if line.startswith("griddepcontrol.wait")]
    before = lines[: waits[0]] if waits else lines
    return {
        "kernel": kernel.__name__,
        "launch_pdl": launch.launch_pdl,
        "pdl_constexpr": bool(launch.constexprs.get("PDL")),
        "compiled_launch_pdl": bool(compiled.metadata.launch_pdl),
        "waits": len(waits),
        "launch_dependents": sum(line.startswith("griddepcontrol.launch_dependents") for line in lines),
        "loads_before_wait": sum(line.startswith(("ld.global", "@%p")) and "ld.global" in line for line in before),
        "writes_before_wait": sum(("st.global" in line or "atom." in line or "red." in line) for line in before),
    }


def main(argv: list[str]) -> int:
    """Print one JSON object for each launch the operations make with PDL ``on`` (compiled for sm_90 and read) or
    ``off`` (the flags only: with ``PDL`` False a kernel is what the interpreter tests run)."""
    pdl = {"on": True, "off": False}[argv[1]]
    print(json.dumps({"triton": triton.__version__}))
    for launch in record_launches(pdl):
        if pdl:
            print(json.dumps(compile_for_hopper(launch)))
        else:
            flags = {"launch_pdl": launch.launch_pdl, "pdl_constexpr": bool(launch.constexprs.get("PDL"))}
            print(json.dumps({"kernel": launch.kernel.__name__, **flags}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
