"""``tests/gpu/flashinfer_warmup.py`` on CPU: which shapes it builds FlashInfer's kernels for (one rank's part of each
FlashInfer case of the tensor-parallel GPU file, each shape once), and that without CUDA it says why in one line and
does nothing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("flashinfer_warmup", ROOT / "tests" / "gpu" / "flashinfer_warmup.py")
assert _spec is not None and _spec.loader is not None
warmup = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = warmup  # its dataclasses look their module up
_spec.loader.exec_module(warmup)


def test_the_plan_is_one_ranks_part_of_each_flashinfer_case_each_shape_once() -> None:
    targets = warmup.plan()
    shapes = [(t.config.model_type, t.config.num_heads, t.config.num_kv_heads, t.config.head_dim) for t in targets]
    # Qwen3 (4 query / 2 KV heads) and Llama (4 / 1), head size 64 in the FlashInfer cases: TP=1 whole, TP=2 halves
    # the query heads and the Qwen3 KV heads (Llama's one KV head is replicated on both ranks).
    qwen3, llama = "qwen3", "llama"
    assert shapes == [(qwen3, 4, 2, 64), (qwen3, 2, 1, 64), (llama, 4, 1, 64), (llama, 2, 1, 64)]
    assert len(set(targets)) == len(targets)
    assert {(t.kernel_backend, t.attention_backend, t.page_size, t.dtype) for t in targets} == {
        ("flashinfer", "flashinfer", 16, "bfloat16")
    }


def test_cases_of_the_same_shape_build_once() -> None:
    case = warmup.WarmupCase("tiny-qwen3-random", 2, warmup.workers.FUSED_PAGED)
    assert len(warmup.plan((case, case))) == 1
    four = warmup.WarmupCase("tiny-qwen3-random", 4, warmup.workers.FUSED_PAGED)
    (quarter,) = warmup.plan((four,))
    assert (quarter.config.num_heads, quarter.config.num_kv_heads) == (1, 1)
    assert (
        quarter.config.intermediate_size * 4
        == warmup.workers.FUSED_PAGED.model_config("tiny-qwen3-random").intermediate_size
    )


def test_without_cuda_it_says_why_in_one_line_and_builds_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the warm-up would build")
    assert warmup.main() == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("FlashInfer warm-up skipped: CUDA is not available")
