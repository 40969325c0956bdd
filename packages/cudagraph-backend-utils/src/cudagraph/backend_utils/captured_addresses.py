"""Where the tensors a graph reads lived when it was captured, and which of them have moved since.

A captured graph keeps raw device addresses: of the static buffers a runner owns, and of everything else its kernels
read, the model's weights and buffers and the KV cache above all. Writing new values into the same memory
(``param.copy_(new)``, the usual weight sync) keeps every graph valid; giving a tensor new memory (assigning a new
``Parameter``, loading a state dict with ``assign=True``, re-allocating a cache) does not: the graph would go on
reading the old memory, stale or freed.

``AddressRecord.of(named_tensors)`` records, per name, a tensor's ``TensorAddress`` (its data pointer, its storage's
pointer and size, its shape, strides and dtype); ``record.moved(named_tensors)`` names every tensor whose address
differs now, or that appeared or went. A record is taken once per capture session and shared by the graphs captured
in it, so recording costs nothing per graph; checking reads every tensor once, so it is done when something says
the weights or caches changed (a weight update, a wake), never per step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch


@dataclass(frozen=True)
class TensorAddress:
    """Where one tensor's data lives: what a graph that reads it bakes in."""

    data_ptr: int
    storage_ptr: int
    storage_nbytes: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorAddress:
        """The address of ``tensor`` now."""
        storage = tensor.untyped_storage()
        return cls(
            tensor.data_ptr(),
            storage.data_ptr(),
            storage.nbytes(),
            tuple(tensor.shape),
            tuple(tensor.stride()),
            tensor.dtype,
        )

    @property
    def released(self) -> bool:
        """Whether the storage holds no memory (resized to nothing: a cache given back while asleep)."""
        return self.storage_nbytes == 0


@dataclass(frozen=True)
class AddressRecord:
    """The addresses of a set of named tensors at one moment (see the module docstring)."""

    addresses: Mapping[str, TensorAddress]

    def __post_init__(self) -> None:
        object.__setattr__(self, "addresses", MappingProxyType(dict(self.addresses)))

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> AddressRecord:
        """The addresses of ``tensors`` (a mapping, or ``(name, tensor)`` pairs) now."""
        pairs = tensors.items() if isinstance(tensors, Mapping) else tensors
        return cls({name: TensorAddress.of(tensor) for name, tensor in pairs})

    def moved(self, now: AddressRecord) -> tuple[str, ...]:
        """The names whose address differs in ``now``, or that only one of the two records holds, sorted."""
        if now is self or now.addresses == self.addresses:
            return ()
        names = set(self.addresses) | set(now.addresses)
        return tuple(sorted(name for name in names if self.addresses.get(name) != now.addresses.get(name)))

    def released(self) -> tuple[str, ...]:
        """The names whose storage held no memory when recorded (a graph captured over them would read nothing)."""
        return tuple(sorted(name for name, address in self.addresses.items() if address.released))

    def __len__(self) -> int:
        return len(self.addresses)


def describe_moved(names: tuple[str, ...], limit: int = 5) -> str:
    """``names`` for a message: the first ``limit`` and how many more (``"a, b, c and 4 more"``)."""
    shown = ", ".join(names[:limit])
    return f"{shown} and {len(names) - limit} more" if len(names) > limit else shown
