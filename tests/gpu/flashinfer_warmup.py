"""Build FlashInfer's JIT kernels for the GPU tests once, before pytest runs them (``tests/gpu/run.py`` runs this in
a process of its own, with the workspace importable).

FlashInfer compiles each kernel the first time a process asks for it and keeps the build in its cache (under
``~/.cache/flashinfer``, for the machine's life). Left to the tests, the first FlashInfer case of the
tensor-parallel file builds them on every rank at once, inside the test (about two minutes on an H200 machine), so
the file does not finish in one 600 s call. Here the engine runs the same forwards on one GPU, at the shapes one
rank of those cases holds (``plan``): a prefill, decode steps and a small ``full`` decode capture over FlashInfer's
kernel set and paged attention. The tests then load what was built.

    python3 tests/gpu/flashinfer_warmup.py        # what run.py does before pytest; prints a line per shape

Without CUDA or without flashinfer it prints one line saying why and does nothing. A failure is reported in one
line and the tests run anyway (they build what they need, and fail there if it cannot be built).
"""

from __future__ import annotations

import importlib.util
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "engine"))  # tp_gpu_workers: the options the tensor-parallel cases run with

import tp_gpu_workers as workers  # noqa: E402

from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig  # noqa: E402
from cudagraph.engine.batch import SamplingParams  # noqa: E402
from cudagraph.engine.generate import generate  # noqa: E402
from cudagraph.engine.model import ModelConfig, ShardPlan  # noqa: E402


@dataclass(frozen=True)
class WarmupCase:
    """A FlashInfer case of the GPU tests: its preset, its tensor-parallel size and the engine options it runs."""

    preset: str
    tp_size: int
    options: workers.EngineOptions


TP_FLASHINFER_CASES = tuple(
    WarmupCase(preset, tp_size, workers.FUSED_PAGED)
    for preset in ("tiny-qwen3-random", "tiny-llama-random")
    for tp_size in (1, 2)
)
"""``test_gpu_engine_tensor_parallel.py``'s FlashInfer cases: both presets with FlashInfer's kernel set and paged
attention (``FUSED_PAGED``) at TP=2, and the TP=1 runs their logits are compared with."""


@dataclass(frozen=True)
class WarmupTarget:
    """What one rank computes with: its part of the model (heads, KV heads, head size, widths), the dtype, the kernel
    set, the attention backend and the KV page size. Cases with the same target build the same kernels."""

    config: ModelConfig
    dtype: str
    kernel_backend: str
    attention_backend: str
    page_size: int

    def describe(self) -> str:
        """One line: the shape and the backends."""
        config = self.config
        return (
            f"{config.num_heads} query / {config.num_kv_heads} KV heads of {config.head_dim}, hidden "
            f"{config.hidden_size}, {self.dtype}, kernels {self.kernel_backend}, attention {self.attention_backend}, "
            f"pages of {self.page_size}"
        )


def plan(cases: tuple[WarmupCase, ...] = TP_FLASHINFER_CASES, dtype: str = "bfloat16") -> list[WarmupTarget]:
    """The distinct targets of ``cases``, in their order: each case's rank-0 part of its model (every rank of a case
    holds the same shape)."""
    targets: dict[WarmupTarget, None] = {}
    for case in cases:
        config = case.options.model_config(case.preset)
        shard = ShardPlan(rank=0, size=case.tp_size, group_name="warmup" if case.tp_size > 1 else None)
        target = WarmupTarget(
            config=shard.local_config(config),
            dtype=dtype,
            kernel_backend=case.options.kernel_backend,
            attention_backend=case.options.attention_backend,
            page_size=case.options.page_size,
        )
        targets.setdefault(target)
    return list(targets)


def unavailable_reason() -> str | None:
    """Why there is nothing to build here (no CUDA device, no flashinfer), or ``None``."""
    import torch

    if not torch.cuda.is_available():
        return f"CUDA is not available (torch {torch.__version__})"
    if importlib.util.find_spec("flashinfer") is None:
        return "flashinfer is not installed (pip install flashinfer-python, or put its wheels in .whl/)"
    return None


WARMUP_PROMPTS = ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18], [5, 6, 7])
WARMUP_BUCKETS = (1, 2)


def warm(target: WarmupTarget, device: str = "cuda:0") -> float:
    """Run ``target``'s forwards once on ``device`` (two prompts: a prefill over more than a page, decode steps
    replaying a ``full`` capture of batch 1 and 2); the seconds it took."""
    from cudagraph.engine.model import random_model
    from cudagraph.engine.model_runner import CacheConfig, ModelRunner

    started = time.perf_counter()
    model = random_model(target.config, seed=0, dtype=target.dtype, device=device)
    graphs = CudaGraphConfig(
        decode=PhaseConfig(Backend.FULL, WARMUP_BUCKETS, max(WARMUP_BUCKETS)),
        prefill=PhaseConfig(Backend.DISABLED, (), 0),
    )
    engine = ModelRunner(
        model,
        graphs,
        cache_config=CacheConfig(max_num_reqs=4, max_context_len=64, page_size=target.page_size),
        kernel_backend=target.kernel_backend,
        attention_backend=target.attention_backend,
    )
    try:
        if engine.kernels.name != target.kernel_backend:
            raise RuntimeError(f"the engine took the {engine.kernels.name!r} kernel set, not {target.kernel_backend!r}")
        engine.init_cuda_graphs()
        generate(engine, [list(prompt) for prompt in WARMUP_PROMPTS], SamplingParams(max_new_tokens=4))
    finally:
        engine.shutdown()
    return time.perf_counter() - started


def main() -> int:
    """Warm every planned target; 0 when built or when there is nothing to build here, 1 when a build failed."""
    reason = unavailable_reason()
    if reason is not None:
        print(f"FlashInfer warm-up skipped: {reason}", flush=True)
        return 0
    started = time.perf_counter()
    for target in plan():
        try:
            seconds = warm(target)
        except Exception as error:  # reported, and the tests run anyway
            print(f"FlashInfer warm-up failed for {target.describe()}: {type(error).__name__}: {error}", flush=True)
            return 1
        print(f"FlashInfer warm-up: {target.describe()}: {seconds:.1f} s", flush=True)
    print(f"FlashInfer warm-up done in {time.perf_counter() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
