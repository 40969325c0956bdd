"""Rotary position embeddings: inverse frequencies (plain, linear- or llama3-scaled) and a cos/sin table indexed
by position.

The table is built once for every position up to ``max_position_embeddings``, so a forward only gathers rows:
no host syncs and no data-dependent shapes, which keeps it capturable in a CUDA graph. Positions beyond the table
are out of range (an index error on the device), never silently wrapped.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from .out_views import compute_into

if TYPE_CHECKING:
    from ..model.architecture import ModelConfig, RopeScaling


def rope_inverse_frequencies(config: ModelConfig, device: torch.device | str = "cpu") -> torch.Tensor:
    """The ``head_dim // 2`` rotary inverse frequencies (float32), scaled as ``config.rope_scaling`` says."""
    exponents = torch.arange(0, config.head_dim, 2, dtype=torch.int64, device=device).float() / config.head_dim
    inverse_frequencies = 1.0 / (config.rope_theta**exponents)
    scaling = config.rope_scaling
    if scaling is None:
        return inverse_frequencies
    return _SCALERS[scaling.rope_type](inverse_frequencies, scaling)


def _scale_linear(inverse_frequencies: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    return inverse_frequencies / scaling.factor


def _scale_llama3(inverse_frequencies: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    # Llama 3.1: long wavelengths are divided by the factor, short ones kept, the band between interpolated.
    assert scaling.low_freq_factor is not None and scaling.high_freq_factor is not None
    assert scaling.original_max_position_embeddings is not None
    context = scaling.original_max_position_embeddings
    low_freq_wavelength = context / scaling.low_freq_factor
    high_freq_wavelength = context / scaling.high_freq_factor
    wavelengths = 2 * math.pi / inverse_frequencies
    scaled = torch.where(wavelengths > low_freq_wavelength, inverse_frequencies / scaling.factor, inverse_frequencies)
    smooth = (context / wavelengths - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelengths >= high_freq_wavelength) & (wavelengths <= low_freq_wavelength)
    return torch.where(is_medium, smoothed, scaled)


_SCALERS = {"linear": _scale_linear, "llama3": _scale_llama3}


def rotary_cos_sin_table(config: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``[max_position_embeddings, 2 * head_dim]``: per position, ``cos`` then ``sign * sin`` over the full head.

    Computed in float32 on ``device`` and rounded to ``dtype`` once, as the reference implementation rounds
    its cos/sin to the activation dtype. The sin half carries the sign of "rotate half" (``-`` on the first half),
    so rotating is ``x * cos + roll(x, head_dim / 2) * signed_sin``: the same products, one roll, no negation.
    """
    inverse_frequencies = rope_inverse_frequencies(config, device)
    positions = torch.arange(config.max_position_embeddings, dtype=torch.int64, device=device).float()
    angles = torch.outer(positions, inverse_frequencies)
    angles = torch.cat((angles, angles), dim=-1)
    half = config.head_dim // 2
    sign = torch.cat((-torch.ones(half, device=device), torch.ones(half, device=device)))
    return torch.cat((angles.cos(), angles.sin() * sign), dim=-1).to(dtype)


def rotary_cos_sin_halves_table(config: ModelConfig, device: torch.device | str) -> torch.Tensor:
    """``[max_position_embeddings, head_dim]`` float32: per position, ``cos`` then ``sin`` of the ``head_dim // 2``
    angles (no repeat, no sign), the layout fused rotary kernels read (FlashInfer's ``cos_sin_cache``; vLLM's and
    SGLang's). Rotating with it: ``x[i] * cos[i] - x[i + D/2] * sin[i]`` for the first half, ``x[i + D/2] * cos[i]
    + x[i] * sin[i]`` for the second; the same angles as ``rotary_cos_sin_table``, kept in float32."""
    inverse_frequencies = rope_inverse_frequencies(config, device)
    positions = torch.arange(config.max_position_embeddings, dtype=torch.int64, device=device).float()
    angles = torch.outer(positions, inverse_frequencies)
    return torch.cat((angles.cos(), angles.sin()), dim=-1)


def apply_rotary(heads: torch.Tensor, cos_sin: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate ``heads`` ``[T, H, D]`` by the gathered table rows ``cos_sin`` ``[T, 2 * D]`` in three kernels (roll,
    product, ``addcmul``: the second product is added before rounding, one rounding fewer than
    ``x * cos + rotate_half(x) * sin``). With ``out`` (``heads`` itself may be it: the last kernel reads only the
    first two's results) the result is written there where ``out_views.compute_into`` can; the result is returned,
    a new contiguous tensor otherwise."""
    head_dim = heads.shape[-1]
    cos = cos_sin[:, None, :head_dim]
    signed_sin = cos_sin[:, None, head_dim:]
    rotated_half = torch.roll(heads, shifts=head_dim // 2, dims=-1)
    if out is None:
        return torch.addcmul(heads * cos, rotated_half, signed_sin)
    return compute_into(out, torch.addcmul, heads * cos, rotated_half, signed_sin)
