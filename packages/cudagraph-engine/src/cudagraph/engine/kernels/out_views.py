"""``compute_into``: an elementwise op's result written into an existing (possibly strided) view when that traces,
else returned as a new tensor.

The decoder writes its normed and rotated q/k heads back into the fused q/k/v projection so that keys and values
stay side by side and the KV store is one kernel. Eager torch does that with ``op(..., out=view)``, one kernel.
Under ``torch.compile`` dynamo refuses an ``out=`` tensor that is not contiguous, and ``view.copy_(result)`` makes
it guard on the token count (its overlap check of a strided view), which would recompile the forward for batch 1;
so there the result stays a new tensor the compiler is free to place, and the KV store pairs keys and values up.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def compute_into(out: torch.Tensor, op: Callable[..., torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
    """``op(*args)`` for an elementwise ``op`` with an ``out=`` variant (``torch.mul``, ``torch.addcmul``), written
    into ``out`` and returned as ``out`` when running eagerly; a new tensor under ``torch.compile``. Callers use the
    returned tensor, never ``out``. ``args`` may share ``out``'s memory only as results computed before the call."""
    if torch.compiler.is_compiling():
        return op(*args)
    return op(*args, out=out)
