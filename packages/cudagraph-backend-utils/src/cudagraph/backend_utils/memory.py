"""Graph memory: non-owning references to graph outputs, and honest memory readings (the pool is ``graph_pool``).

Two pitfalls shape this module. A graph output held strongly pins its block of the shared pool, so the next capture
cannot reuse it (many shapes then cost many times the memory); ``weak_ref_tensor`` gives an alias that reads the
same memory without pinning it. And the caching allocator keeps freed blocks, so free memory read without
``empty_cache`` first says nothing about what a capture took; ``read_device_memory`` returns the cache first unless
told not to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .errors import exception_chain, require_cuda


def weak_ref_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor reading ``tensor``'s memory (same shape, strides, dtype) without keeping that memory alive.

    Use it for graph outputs in a shared pool: the graph rewrites that memory on every replay, and the pool may give
    it to the next capture once the strong reference is dropped, which is safe because graphs sharing a pool never
    replay at the same time. Never use it for memory the allocator may hand to ordinary (non-graph) tensors.

    Example:
        >>> import torch
        >>> owner = torch.arange(4.0)
        >>> alias = weak_ref_tensor(owner)
        >>> alias.data_ptr() == owner.data_ptr(), alias.tolist()
        (True, [0.0, 1.0, 2.0, 3.0])
    """
    storage = tensor.untyped_storage()
    # A storage built from a raw pointer has no deleter: it never frees (or pins) the memory it points at.
    alias_storage = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), tensor.device, storage.nbytes())
    alias = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    return alias.set_(alias_storage, tensor.storage_offset(), tensor.size(), tensor.stride())


def weak_ref_tensors(value: Any) -> Any:
    """``value`` with every tensor in it (nested tuples, lists, dicts) replaced by ``weak_ref_tensor``."""
    return torch.utils._pytree.tree_map_only(torch.Tensor, weak_ref_tensor, value)


@dataclass(frozen=True)
class MemoryReading:
    """Device memory at one moment, read after synchronizing and returning cached blocks to the driver."""

    free_bytes: int
    """Free memory as the driver sees it: what every process on the device can still get."""
    reserved_bytes: int
    """Memory the caching allocator holds (allocated blocks plus graph pools that are still in use)."""
    allocated_bytes: int
    """Memory in live tensors."""
    peak_allocated_bytes: int = 0
    """The most memory live tensors held at once since the last reading taken with ``reset_peak=True`` (or since
    the process started)."""


def read_device_memory(
    device: torch.device | str | int | None = None, *, settle: bool = True, reset_peak: bool = False
) -> MemoryReading:
    """Synchronize ``device``, return the allocator's free cached blocks to the driver, then read its memory.

    ``settle=False`` skips the synchronization and the cache flush: a cheap reading for progress displays and
    per-step figures, in which free memory does not count blocks the allocator merely cached. ``reset_peak=True``
    restarts the peak after reading it, so the next reading's ``peak_allocated_bytes`` covers only what ran between
    the two.
    """
    device = require_cuda(device)
    if settle:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    free_bytes, _total = torch.cuda.mem_get_info(device)
    reading = MemoryReading(
        free_bytes=free_bytes,
        reserved_bytes=torch.cuda.memory_reserved(device),
        allocated_bytes=torch.cuda.memory_allocated(device),
        peak_allocated_bytes=torch.cuda.max_memory_allocated(device),
    )
    if reset_peak:
        torch.cuda.reset_peak_memory_stats(device)
    return reading


_OUT_OF_MEMORY_MESSAGES = ("CUDA error: out of memory", "cudaErrorMemoryAllocation")
"""How a ``RuntimeError`` says the driver itself ran out of memory (instantiating a graph, say), where the caching
allocator would have raised ``torch.OutOfMemoryError``."""


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is, or was raised from or while handling, the device running out of memory
    (``torch.OutOfMemoryError``, or a ``RuntimeError`` in which the driver says so), however many wrappers stand
    between (a ``CudaGraphCaptureError`` names its cause in ``__cause__``): any link of ``exception_chain(error)``.

    Example:
        >>> import torch
        >>> try:
        ...     try:
        ...         raise torch.OutOfMemoryError("CUDA out of memory")
        ...     except torch.OutOfMemoryError as cause:
        ...         raise RuntimeError("capturing shape 8 failed") from cause
        ... except RuntimeError as error:
        ...     is_out_of_memory(error), is_out_of_memory(ValueError("no"))
        (True, False)
    """
    return any(_says_out_of_memory(link) for link in exception_chain(error))


def _says_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` itself (not its chain) is the device running out of memory."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(text in str(error) for text in _OUT_OF_MEMORY_MESSAGES)


def free_device_memory(device: torch.device | str | int | None = None) -> int:
    """Free bytes on ``device`` as the driver sees them, after returning the allocator's cached blocks."""
    return read_device_memory(device).free_bytes


class DeviceMemoryProbe:
    """Measure the device memory a block of work keeps: ``with DeviceMemoryProbe(dev) as probe: ...``.

    ``bytes_taken`` is the drop in driver-visible free memory between entry and exit, both read after
    ``empty_cache``: it counts the pool blocks the graphs keep and the memory of instantiated graphs (which the
    allocator never sees), and none of the blocks the allocator merely cached. ``reserved_bytes_taken`` is the
    allocator's own share.
    """

    def __init__(self, device: torch.device | str | int | None = None) -> None:
        self.device = require_cuda(device)
        self.before: MemoryReading | None = None
        self.after: MemoryReading | None = None

    def __enter__(self) -> DeviceMemoryProbe:
        self.before = read_device_memory(self.device)
        self.after = None
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.after = read_device_memory(self.device)

    def _readings(self) -> tuple[MemoryReading, MemoryReading]:
        if self.before is None or self.after is None:
            raise RuntimeError("DeviceMemoryProbe has no reading yet: read it after its `with` block has ended")
        return self.before, self.after

    @property
    def bytes_taken(self) -> int:
        """Driver-visible bytes the block kept (negative when it freed memory)."""
        before, after = self._readings()
        return before.free_bytes - after.free_bytes

    @property
    def reserved_bytes_taken(self) -> int:
        """Bytes the caching allocator kept reserved because of the block."""
        before, after = self._readings()
        return after.reserved_bytes - before.reserved_bytes
