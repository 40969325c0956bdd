"""A CPU stand-in for the four FlashInfer functions the fused kernel set calls, so its plumbing (which weight row,
which heads, the table layout, positions, in-place writes) and the kernel-set choice can be tested without a GPU.

Each function follows FlashInfer 0.5.3's documented contract (signature, in-place behaviour, float32 math rounded
once) and raises where the real one checks its arguments (dimensions, contiguous last dimension, the float32
table, 16-byte rows), but it accepts float32 so that the fused plumbing can be compared with the torch kernels
tightly. What the real kernels compute is proved on the GPU (tests/gpu/model/test_fused_kernels_gpu.py).
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

FLASHINFER_KERNELS_MODULE = "cudagraph.engine.kernels.flashinfer.layer_set"


def _check_last_dim_contiguous(*tensors: torch.Tensor) -> None:
    for tensor in tensors:
        if tensor.stride(-1) != 1:
            raise ValueError(f"last dimension must be contiguous, got strides {tensor.stride()}")


def _normed(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    _check_last_dim_contiguous(input, weight)
    if input.dim() not in (2, 3) or weight.dim() != 1 or input.shape[-1] != weight.shape[0]:
        raise ValueError(f"rmsnorm takes [B, D] or [B, H, D] and weight [D], got {input.shape} and {weight.shape}")
    result = _normed(input.float(), weight, eps).to(input.dtype)
    if out is None:
        return result
    _check_last_dim_contiguous(out)
    out.copy_(result)
    return out


def fused_add_rmsnorm(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, enable_pdl: bool | None = None
) -> None:
    _check_last_dim_contiguous(input, residual, weight)
    if input.dim() != 2 or residual.shape != input.shape or weight.shape != input.shape[-1:]:
        raise ValueError(f"fused_add_rmsnorm takes [B, D] twice and [D], got {input.shape}, {residual.shape}")
    total = input.float() + residual.float()
    residual.copy_(total)
    input.copy_(_normed(total, weight, eps))


def apply_rope_with_cos_sin_cache_inplace(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> None:
    if cos_sin_cache.dtype != torch.float32:
        raise ValueError("cos_sin_cache should be float32")
    if not positions.is_contiguous() or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"positions must be contiguous int32/int64, got {positions.dtype}")
    if not is_neox:
        raise NotImplementedError("the stand-in rotates Neox-style only")
    half = cos_sin_cache.shape[1] // 2
    cos = cos_sin_cache[positions, None, :half]
    sin = cos_sin_cache[positions, None, half:]
    for tensor in (query, key):
        heads = tensor.view(tensor.shape[0], -1, head_size)
        first, second = heads[..., :half].float(), heads[..., half : 2 * half].float()
        rotated = torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)
        heads[..., : 2 * half] = rotated.to(heads.dtype)


def silu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None) -> torch.Tensor:
    if input.shape[-1] * input.dtype.itemsize % 16 != 0:
        raise ValueError("The pointers must be multiple of 16 bytes.")
    width = input.shape[-1] // 2
    result = (F.silu(input[..., :width].float()) * input[..., width:].float()).to(input.dtype)
    if out is None:
        return result
    out.copy_(result)
    return out


def install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import flashinfer.norm`` (``.rope``, ``.activation``) import the stand-in until the test ends, and the
    fused kernel module import afresh against it."""
    package = types.ModuleType("flashinfer")
    submodules = {
        "norm": {"rmsnorm": rmsnorm, "fused_add_rmsnorm": fused_add_rmsnorm},
        "rope": {"apply_rope_with_cos_sin_cache_inplace": apply_rope_with_cos_sin_cache_inplace},
        "activation": {"silu_and_mul": silu_and_mul},
    }
    monkeypatch.setitem(sys.modules, "flashinfer", package)
    for name, functions in submodules.items():
        module = types.ModuleType(f"flashinfer.{name}")
        for function_name, function in functions.items():
            setattr(module, function_name, function)
        setattr(package, name, module)
        monkeypatch.setitem(sys.modules, f"flashinfer.{name}", module)
    _forget_fused_module(monkeypatch)


def uninstall(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import flashinfer`` fail as it does where the package is not installed, until the test ends."""
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    _forget_fused_module(monkeypatch)


def _forget_fused_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drop the fused kernel module from the import cache for this test (it is imported afresh against whatever
    ``flashinfer`` is now), and restore the cache as it was afterwards."""
    monkeypatch.setitem(sys.modules, FLASHINFER_KERNELS_MODULE, None)  # records the original entry, or its absence
    monkeypatch.delitem(sys.modules, FLASHINFER_KERNELS_MODULE)
