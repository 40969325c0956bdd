"""Host cost of one Triton kernel launch (a script, not a test): Triton's JIT call, ``FastLauncher`` and a bound
``direct_launch``, timed in one process on the same kernel and arguments; and the host cost of copying a decode
batch's inputs into a runner's static buffers, the runner's torch path against one fused Triton copy kernel.

    python3 bench/bench_launch.py [--launches 200] [--repeats 7] [--out FILE.json]

The kernel has the engine's projection's shape of argument list (tensors, integers, a float, constexprs last). Each
figure is the median over ``--repeats`` of ``--launches`` back-to-back launches timed on the host while the device
is kept busy by a sleep queued first (so no launch waits for the device), divided by the launches. The engine's own
``kernels.triton.ops.gemv`` (a batch-1 projection with its output allocation) is timed the same way, through
``FastLauncher`` and forced through the JIT call. Prints the table and the ratios to the JIT call, writes JSON.
Needs CUDA and Triton.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(path) for path in sorted(ROOT.glob("packages/*/src"))]

from harness.engine_timing import host_time_us  # noqa: E402

from cudagraph.backend_utils import FastLauncher, through_jit  # noqa: E402
from cudagraph.engine.kernels.triton import ops as triton_ops  # noqa: E402


@triton.jit
def _scaled_sum_kernel(
    x_ptr, y_ptr, out_ptr, scale_ptr, n, x_stride, y_stride, out_stride, rows, alpha, beta,
    BLOCK: tl.constexpr, HAS_SCALE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (offsets < n) & (row < rows)
    x = tl.load(x_ptr + row * x_stride + offsets, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + row * y_stride + offsets, mask=mask, other=0.0).to(tl.float32)
    total = alpha * x + beta * y
    if HAS_SCALE:
        total *= tl.load(scale_ptr + offsets, mask=mask, other=1.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + offsets, total.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_decode_inputs_kernel(
    ids_src, ids_dst, pos_src, pos_dst, loc_src, loc_dst, lens_src, lens_dst, rows_src, rows_dst, n,
    BLOCK: tl.constexpr,
):  # fmt: skip
    # One launch for a decode batch's five inputs (four int64 fields and the int32 seq_lens), against the torch path's
    # two (one _foreach_copy_ of the int64 fields, one copy_).
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(ids_dst + offsets, tl.load(ids_src + offsets, mask=mask), mask=mask)
    tl.store(pos_dst + offsets, tl.load(pos_src + offsets, mask=mask), mask=mask)
    tl.store(loc_dst + offsets, tl.load(loc_src + offsets, mask=mask), mask=mask)
    tl.store(lens_dst + offsets, tl.load(lens_src + offsets, mask=mask), mask=mask)
    tl.store(rows_dst + offsets, tl.load(rows_src + offsets, mask=mask), mask=mask)


def input_copy_paths(device: torch.device, batch_size: int = 1) -> dict[str, Callable[[], object]]:
    """A decode batch's inputs copied into a runner's static buffers, rotating over four source batches: the
    runner's ``StaticBuffers.copy_in`` (torch) and one fused Triton copy (``FastLauncher``, and bound to one source)."""
    from cudagraph.runner import ForwardBatch, ForwardMode
    from cudagraph.runner.static_buffers import DECODE_FIELDS, StaticBuffers

    static = StaticBuffers.allocate(DECODE_FIELDS, 256, 256, device, seq_len_fill_value=1)
    static.mirror_seq_lens_cpu = False

    def batch(seed: int) -> ForwardBatch:
        def column(dtype: torch.dtype) -> torch.Tensor:
            return torch.arange(seed, seed + batch_size, device=device, dtype=dtype)

        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=batch_size,
            input_ids=column(torch.int64),
            positions=column(torch.int64),
            out_cache_loc=column(torch.int64),
            seq_lens=column(torch.int32),
            seq_lens_sum=0,
            req_pool_indices=column(torch.int64),
        )

    batches = [batch(seed) for seed in range(4)]
    names = [spec.name for spec in DECODE_FIELDS]
    fused = FastLauncher(_load_decode_inputs_kernel)

    def fused_args(source: ForwardBatch) -> tuple[object, ...]:
        pairs = [(getattr(source, name), static.view(name, batch_size)) for name in names]
        return (*[tensor for pair in pairs for tensor in pair], batch_size)

    rotation = iter(range(1 << 62))
    bound = fused.bind((1,), fused_args(batches[0]), {"BLOCK": 256}, num_warps=1)

    def torch_load() -> None:
        static.load(batches[next(rotation) % 4], batch_size, batch_size)

    def fused_load() -> None:
        fused((1,), fused_args(batches[next(rotation) % 4]), {"BLOCK": 256}, num_warps=1)

    return {
        "inputs: StaticInputs.load (torch)": torch_load,
        "inputs: fused Triton copy": fused_load,
        "inputs: fused copy, bound": bound,
    }


def host_us_per_launch(launch: Callable[[], object], launches: int, repeats: int, device: torch.device) -> float:
    """Median host microseconds a launch: ``harness.engine_timing.host_time_us`` of ``launches`` back-to-back
    launches, behind a device sleep long enough for all of them."""

    def burst() -> None:
        for _ in range(launches):
            launch()

    microseconds, waited = host_time_us(burst, device, repeats=repeats, head_start_ms=50.0)
    if waited:
        print(f"  (a burst of {launches} launches waited on the device: raise the head start)")
    return microseconds / launches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("bench-results/bench_launch.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_launch needs a CUDA device")
    device = torch.device("cuda")
    x, y, out = (torch.randn(1, 1024, device=device, dtype=torch.bfloat16) for _ in range(3))
    scale = torch.ones(1024, device=device, dtype=torch.bfloat16)
    grid = (1, triton.cdiv(1024, 256))
    kernel_args = (x, y, out, scale, 1024, x.stride(0), y.stride(0), out.stride(0), 1, 0.5, 2.0)
    constexprs = {"BLOCK": 256, "HAS_SCALE": True}
    fast = FastLauncher(_scaled_sum_kernel)
    bound = fast.bind(grid, kernel_args, constexprs)
    weight = torch.randn(4096, 1024, device=device, dtype=torch.bfloat16) / 32
    paths: dict[str, Callable[[], object]] = {
        "kernel: Triton JIT call": lambda: _scaled_sum_kernel[grid](*kernel_args, **constexprs),
        "kernel: FastLauncher": lambda: fast(grid, kernel_args, constexprs),
        "kernel: bound direct_launch": bound,
        "engine gemv: FastLauncher": lambda: triton_ops.gemv(x, weight),
    }
    paths.update(input_copy_paths(device))
    timings = {name: host_us_per_launch(launch, args.launches, args.repeats, device) for name, launch in paths.items()}
    with through_jit():  # the same op, every launch through Triton's JIT call
        timings["engine gemv: Triton JIT call"] = host_us_per_launch(
            lambda: triton_ops.gemv(x, weight), args.launches, args.repeats, device
        )
    torch.testing.assert_close(out, (0.5 * x.float() + 2.0 * y.float()).to(out.dtype), rtol=1e-2, atol=1e-2)
    ratios = {
        "kernel: JIT / FastLauncher": timings["kernel: Triton JIT call"] / timings["kernel: FastLauncher"],
        "kernel: JIT / bound": timings["kernel: Triton JIT call"] / timings["kernel: bound direct_launch"],
        "engine gemv: JIT / FastLauncher": timings["engine gemv: Triton JIT call"]
        / timings["engine gemv: FastLauncher"],
    }
    print(
        f"host µs a launch on {torch.cuda.get_device_name()} (triton {triton.__version__}, torch {torch.__version__})"
    )
    for name, value in timings.items():
        print(f"  {name:32s} {value:7.2f}")
    for name, value in ratios.items():
        print(f"  {name:32s} {value:7.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "launches": args.launches,
        "repeats": args.repeats,
        "host_us_per_launch": timings,
        "ratios": ratios,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
