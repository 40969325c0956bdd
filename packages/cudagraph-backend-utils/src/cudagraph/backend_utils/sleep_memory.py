"""Device memory that a sleep gives back and a wake maps again at the same virtual addresses.

A captured CUDA graph reads and writes fixed device addresses. Freeing its memory at sleep (as the caching allocator
does) forces a recapture at wake. Memory allocated through CUDA's virtual memory API (``cuMemCreate`` and
``cuMemMap`` at a reserved virtual range) can instead release its physical pages (``cuMemUnmap``,
``cuMemRelease``) and map fresh pages at the *same* addresses later: a graph captured over it replays after a wake
with nothing captured again.

The virtual-memory allocator is ``torch-memory-saver`` (SGLang's), used in its ``torch`` hook mode: a pluggable
allocator behind ``torch.cuda.MemPool``, so it needs no ``LD_PRELOAD`` and no process started in a special way.
vLLM records (``vllm/device_allocator/cumem.py``) that binding the driver API from Python, through ``cuda-python`` or
a ctypes wrapper of libcuda, failed for it with a CUDA context mismatch, and that only a small C extension calling
the driver worked; torch-memory-saver is such an extension, maintained and shipped as wheels for CUDA 12 and 13.
This module is the only code that touches it.

Memory is grouped by ``MemoryTag``: the graphs' pool, the KV cache, the weights. ``release(tags)`` unmaps a tag's
pages (their contents are lost), ``restore(tags)`` maps new pages at the same addresses (their contents are
undefined: the caller refills what it needs: a zeroed KV cache, weights copied back or loaded anew).

Each ``SleepMemory`` (one per engine: ``SleepMemory.create``) tags its memory apart from every other's, so engines
of one process sleep and wake on their own. Three rules of the allocator and of torch this module keeps for its
callers:

- the allocator's free entry point ends the process (``exit(1)``) when called outside one of its regions, and torch
  calls it when a pool it allocated from is destroyed. So the pools are never destroyed: graphs released at a
  recapture give their blocks back to their pool, which later captures reuse; ``close()`` unmaps the pages of what
  its engine no longer needs; and at interpreter exit every pool is kept past the finalizers (the process's end
  returns the memory);
- torch keeps per-pool state of the pinned host blocks a capture uses, which breaks when a pool all of whose graphs
  were released is captured into again: a pool of sleepable memory stays held (``GraphPool.keeper``; its anchors are
  never released) and each ``SleepMemory`` makes its own;
- the region settings are per thread: ``capturing()`` (what ``GraphPool`` enters around a capture) must run on the
  thread that captures.

Without CUDA, without ``torch-memory-saver``, or with a torch whose allocator cannot take a pluggable pool,
``sleep_memory_unavailable_reason`` says why in one line and ``SleepMemory.create`` raises
``SleepMemoryUnavailableError`` with that line; callers fall back to freeing and recapturing.

Example (on a CUDA machine with ``cudagraph-backend-utils[sleep]`` installed)::

    memory = SleepMemory.create("cuda")
    with memory.allocating(MemoryTag.KV_CACHE):
        kv_cache = torch.zeros(1 << 28, device="cuda")      # pages the sleep gives back
    pool = memory.graph_pool()                              # capture graphs into it; they outlive a sleep
    memory.release({MemoryTag.GRAPHS, MemoryTag.KV_CACHE})  # asleep: the pages are free for training
    memory.restore({MemoryTag.GRAPHS, MemoryTag.KV_CACHE})  # awake: same addresses
    kv_cache.zero_()                                        # contents are undefined after a restore
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import enum
import importlib.util
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from .graph_pool import GraphPool

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'cudagraph-backend-utils[sleep]' (torch-memory-saver)"
"""What to install for memory that outlives a sleep."""


class MemoryTag(str, enum.Enum):
    """What a piece of sleepable memory holds; ``release`` and ``restore`` act on tags."""

    GRAPHS = "graphs"
    """The graph pool: graphs' intermediates and outputs, rewritten by every replay."""
    KV_CACHE = "kv_cache"
    """The paged KV cache: comes back empty."""
    WEIGHTS = "weights"
    """The model's parameters and buffers: copied out and back (level 1) or loaded anew by the caller (level 2)."""

    def __str__(self) -> str:
        return self.value


class SleepMemoryUnavailableError(RuntimeError):
    """Sleepable memory was asked for where it cannot exist; the message is the one-line reason."""


def sleep_memory_unavailable_reason(device: torch.device | str | int | None = None) -> str | None:
    """Why memory that outlives a sleep cannot be had on ``device`` (one line), or ``None`` when it can."""
    resolved = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
    if resolved.type != "cuda" or not torch.cuda.is_available():
        return f"memory that outlives a sleep needs a CUDA device (got {resolved}, torch {torch.__version__})"
    if torch.version.hip:
        return "memory that outlives a sleep is built for CUDA's virtual memory API; this torch is a ROCm build"
    if not hasattr(torch.cuda, "MemPool") or not hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
        return f"torch {torch.__version__} has no torch.cuda.MemPool with a pluggable allocator (torch 2.6 or later)"
    if "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        return "PYTORCH_CUDA_ALLOC_CONF sets expandable_segments:True, which the virtual-memory allocator cannot serve"
    if importlib.util.find_spec("torch_memory_saver") is None:
        return f"torch-memory-saver is not installed: {INSTALL_HINT}"
    return None


class SleepMemory:
    """Sleepable memory of one engine on one CUDA device (see the module docstring); made by ``create``."""

    _made = 0
    _made_lock = threading.Lock()

    def __init__(self, device: torch.device, saver: Any, prefix: str) -> None:
        self.device = device
        self._saver = saver
        self.prefix = prefix
        """What this memory's tags start with in the allocator (each ``SleepMemory`` has its own)."""
        self._graph_pool: GraphPool | None = None
        self.released: set[MemoryTag] = set()
        """Tags whose pages are unmapped now (between ``release`` and ``restore``)."""

    @classmethod
    def create(cls, device: torch.device | str | int | None = None) -> SleepMemory:
        """New sleepable memory on ``device``, or one ``SleepMemoryUnavailableError`` saying why there is none."""
        reason = sleep_memory_unavailable_reason(device)
        if reason is not None:
            raise SleepMemoryUnavailableError(reason)
        resolved = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
        index = resolved.index if resolved.index is not None else torch.cuda.current_device()
        with cls._made_lock:
            cls._made += 1
            prefix = f"cudagraph{cls._made}:"
        return cls(torch.device("cuda", index), _torch_mode_saver(), prefix)

    def _tag(self, tag: MemoryTag) -> str:
        return f"{self.prefix}{tag}"

    @contextlib.contextmanager
    def allocating(self, tag: MemoryTag) -> Iterator[None]:
        """Tensors allocated on this device inside come from sleepable memory of ``tag``."""
        with torch.cuda.device(self.device), self._saver.region(tag=self._tag(tag)):
            yield

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """The allocator's settings for the graph pool, on this thread (``GraphPool`` enters this around a capture, so
        the pool's blocks are allocated as graph memory)."""
        with self._saver._impl._with_region_config(
            tag=self._tag(MemoryTag.GRAPHS), enable_cpu_backup=False, cpu_backup_backend=None
        ):
            yield

    def graph_pool(self) -> GraphPool:
        """This memory's graph pool: graphs captured into it keep their addresses across a sleep. It is held for the
        process's life (see the module docstring), so releasing it frees nothing."""
        if self._graph_pool is None:
            with torch.cuda.device(self.device):
                self._saver._ensure_initialized()
                key = (self._tag(MemoryTag.GRAPHS), False, False, "", self.device.index)
                mem_pool = self._saver._impl._mem_pools[key]
            self._graph_pool = GraphPool(mem_pool.id, self.device, scope=self.capturing, keeper=mem_pool)
        return self._graph_pool

    def release(self, tags: Iterable[MemoryTag]) -> None:
        """Unmap the pages of ``tags`` (their contents are lost); the addresses stay reserved. Releasing a tag that
        is released already does nothing."""
        torch.cuda.synchronize(self.device)
        for tag in sorted(set(tags) - self.released, key=str):
            self._saver.pause(self._tag(tag))
            self.released.add(tag)

    def restore(self, tags: Iterable[MemoryTag]) -> None:
        """Map new pages at the reserved addresses of ``tags``; their contents are undefined until the caller writes
        them. Restoring a tag that is not released does nothing."""
        for tag in sorted(set(tags) & self.released, key=str):
            self._saver.resume(self._tag(tag))
            self.released.discard(tag)

    def close(self) -> None:
        """The engine's graphs are gone for good: unmap the graph pool's pages (its addresses stay reserved until the
        process ends). The weights and the KV cache stay: they are the model's and the cache's to drop."""
        self.release({MemoryTag.GRAPHS})

    def __repr__(self) -> str:
        released = ", ".join(sorted(map(str, self.released))) or "nothing"
        return f"SleepMemory({self.device}, {self.prefix!r}, released: {released})"


_SAVER: Any = None


def _torch_mode_saver() -> Any:
    """The process's torch-memory-saver in ``torch`` hook mode (a pluggable allocator, no ``LD_PRELOAD``)."""
    global _SAVER
    if _SAVER is None:
        import torch_memory_saver

        saver = torch_memory_saver.TorchMemorySaver()
        saver.hook_mode = "torch"
        atexit.register(_keep_pools_past_exit, saver)
        _SAVER = saver
    return _SAVER


def _keep_pools_past_exit(saver: Any) -> None:
    """Keep every pool of the allocator alive through the interpreter's finalizers: a destroyed pool frees its pages
    through the allocator, which ends the process outside a region, and torch's pool bookkeeping may already be torn
    down by then. The process's end returns the memory."""
    if saver._impl is None:
        return
    for mem_pool in list(saver._impl._mem_pools.values()):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(mem_pool))
