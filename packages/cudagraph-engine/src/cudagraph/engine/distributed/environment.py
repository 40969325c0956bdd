"""The environment every tensor-parallel process runs with: NVLink multicast off, for NCCL, symmetric memory and
NVSHMEM alike (a program using multicast can put a host's GPUs out of service)."""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from types import MappingProxyType

MULTICAST_OFF: Mapping[str, str] = MappingProxyType(
    {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
)
"""Variables that keep NVLink multicast (NVLS, ``multimem``) off; set, not defaulted, so nothing turns it on."""


def disable_multicast(environ: MutableMapping[str, str] | None = None) -> None:
    """Set ``MULTICAST_OFF`` in ``environ`` (default: this process's environment, which children inherit)."""
    (os.environ if environ is None else environ).update(MULTICAST_OFF)
