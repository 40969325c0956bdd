"""How the model's all-reduces travel, chosen once when the group starts and logged.

``process-group``: ``torch.distributed.all_reduce`` on the group's backend (NCCL on CUDA, gloo on CPU).
``symm-mem``: torch's symmetric-memory one-shot all-reduce (``torch.ops.symm_mem.one_shot_all_reduce_out``: each
rank reads every peer's buffer over P2P and sums; never the multicast ``multimem`` variants) for messages up to
``ONE_SHOT_MAX_BYTES``, NCCL above. Inside a CUDA graph on two NVLink-connected H200s the one-shot kernel takes
7-9 us against NCCL's 19-22 us for 2-256 KiB, copy into its buffer included. ``auto`` takes ``symm-mem`` where it
works (CUDA, the op present, the rendezvous and a checked trial reduction succeed on every rank), else
``process-group``. Every rank makes the same choice: the ranks agree on each step before taking it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

ALL_REDUCE_CHOICES = ("auto", "process-group", "symm-mem")
"""Values of ``--tp-all-reduce``."""

_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
"""``all_gather_single`` where torch has it (newer releases deprecate the old name), else
``all_gather_into_tensor``: the same call."""

ONE_SHOT_MAX_BYTES = 256 * 1024
"""Largest message the one-shot path takes (the range it was measured faster in); larger ones go to NCCL."""


class ProcessGroupCommunicator:
    """All-reduce, all-gathers and all-to-all through ``torch.distributed`` on ``group`` (NCCL or gloo)."""

    kind = "process-group"

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.world_size = group.size()

    def all_reduce_(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over the group, in place."""
        dist.all_reduce(tensor, group=self.group)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``[world_size, *tensor.shape]``: every rank's ``tensor`` in rank order."""
        gathered = tensor.new_empty((self.world_size, *tensor.shape))
        self.all_gather_into(gathered, tensor)
        return gathered

    def all_gather_into(self, out: torch.Tensor, tensor: torch.Tensor) -> None:
        """Every rank's ``tensor`` written into ``out`` (contiguous, ``[world_size, *tensor.shape]``), in rank order:
        what ``all_gather`` returns, in memory the caller owns."""
        # Rows concatenated along dim 0 (the layout gloo and NCCL both take), seen per rank through ``out``.
        rows = out.view(self.world_size * tensor.shape[0], *tensor.shape[1:])
        _all_gather_single(rows, tensor.contiguous(), group=self.group)

    def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` ``[world_size, C, ...]``: block ``r`` goes to rank ``r``; the blocks received, in rank order.
        Uniform splits: no sizes are passed, so nothing is read back to the host and a graph captures it."""
        received = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        dist.all_to_all_single(received, tensor.contiguous(), group=self.group)
        return received

    def describe(self) -> str:
        """One line for the start-up log."""
        return f"{dist.get_backend(self.group)} all-reduce for every message"

    def close(self) -> None:
        """Nothing to release."""


class SymmetricMemoryCommunicator(ProcessGroupCommunicator):
    """One-shot all-reduce through a symmetric-memory buffer of ``capacity`` elements for messages that fit it (in
    its dtype), the process group for the rest and for all-gathers and all-to-alls."""

    kind = "symm-mem"

    def __init__(self, group: dist.ProcessGroup, buffer: torch.Tensor, handle: object) -> None:
        super().__init__(group)
        self.buffer = buffer
        self.handle = handle  # keeps the rendezvous (peer mappings) alive as long as the buffer is used
        self.capacity = buffer.numel()
        self.group_name = group.group_name

    def all_reduce_(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over the group, in place: copy into this rank's buffer, then one kernel reads every
        peer's buffer and writes the sum into ``tensor``."""
        if tensor.numel() > self.capacity or tensor.dtype != self.buffer.dtype or not tensor.is_contiguous():
            super().all_reduce_(tensor)
            return
        staged = self.buffer[: tensor.numel()].view(tensor.shape)
        staged.copy_(tensor)
        torch.ops.symm_mem.one_shot_all_reduce_out(staged, "sum", self.group_name, tensor)

    def describe(self) -> str:
        """One line for the start-up log."""
        size = self.capacity * self.buffer.element_size()
        return (
            f"symmetric-memory one-shot all-reduce (P2P, multicast off) for {self.buffer.dtype} messages up to "
            f"{size // 1024} KiB, {dist.get_backend(self.group)} above"
        )

    def close(self) -> None:
        """Drop the buffer and its rendezvous handle."""
        del self.buffer, self.handle


@dataclass(frozen=True)
class AllReduceChoice:
    """What the group chose and why (logged once at start-up, reported by ``bench``)."""

    communicator: ProcessGroupCommunicator
    reason: str

    @property
    def kind(self) -> str:
        """``process-group`` or ``symm-mem``."""
        return self.communicator.kind


def choose_all_reduce(
    requested: str,
    group: dist.ProcessGroup,
    cpu_group: dist.ProcessGroup,
    device: torch.device,
    dtype: torch.dtype,
    max_message_elements: int,
) -> AllReduceChoice:
    """The communicator for ``requested`` (one of ``ALL_REDUCE_CHOICES``); ``max_message_elements`` is the largest
    decode all-reduce (largest bucket x hidden size), what the symmetric buffer is sized for (capped at
    ``ONE_SHOT_MAX_BYTES``). A ``symm-mem`` request that cannot be met is an error; ``auto`` falls back."""
    if requested not in ALL_REDUCE_CHOICES:
        raise ValueError(f"all-reduce {requested!r} is not one of {', '.join(ALL_REDUCE_CHOICES)}")
    fallback = ProcessGroupCommunicator(group)
    if requested == "process-group":
        return AllReduceChoice(fallback, "asked for (--tp-all-reduce process-group)")
    elements = min(max_message_elements, ONE_SHOT_MAX_BYTES // torch.empty((), dtype=dtype).element_size())
    communicator, why_not = _try_symmetric_memory(group, cpu_group, device, dtype, elements)
    if communicator is not None:
        return AllReduceChoice(communicator, "available on every rank")
    if requested == "symm-mem":
        raise RuntimeError(f"--tp-all-reduce symm-mem is not available: {why_not}; use auto or process-group")
    return AllReduceChoice(fallback, f"symmetric memory unavailable: {why_not}")


def _all_ranks_agree(ok: bool, cpu_group: dist.ProcessGroup) -> bool:
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=cpu_group)
    return bool(flag.item())


def _local_symmetric_memory_problem(device: torch.device) -> str | None:
    if device.type != "cuda":
        return f"the model runs on {device.type}, and symmetric memory needs CUDA"
    if not hasattr(torch.ops, "symm_mem") or not hasattr(torch.ops.symm_mem, "one_shot_all_reduce_out"):
        return f"torch {torch.__version__} has no symm_mem.one_shot_all_reduce_out"
    peers = [other for other in range(torch.cuda.device_count()) if other != device.index]
    blocked = [peer for peer in peers if not torch.cuda.can_device_access_peer(device, peer)]
    if blocked:
        return f"{device} has no P2P access to GPUs {blocked}"
    return None


def _try_symmetric_memory(
    group: dist.ProcessGroup, cpu_group: dist.ProcessGroup, device: torch.device, dtype: torch.dtype, elements: int
) -> tuple[SymmetricMemoryCommunicator | None, str]:
    """A checked symmetric-memory communicator, or ``None`` and why not; every rank gets the same answer."""
    problem = _local_symmetric_memory_problem(device)
    if not _all_ranks_agree(problem is None, cpu_group):
        return None, problem or "another rank cannot use it"
    try:
        from torch.distributed import _symmetric_memory as symm_mem

        buffer = symm_mem.empty(elements, dtype=dtype, device=device)
        handle = symm_mem.rendezvous(buffer, group.group_name)
        communicator = SymmetricMemoryCommunicator(group, buffer, handle)
        # A trial reduction whose sum every rank knows: a path that runs but sums wrong is not taken.
        trial = torch.full((min(elements, 1024),), float(group.rank() + 1), dtype=dtype, device=device)
        communicator.all_reduce_(trial)
        expected = group.size() * (group.size() + 1) / 2
        problem = None if bool((trial == expected).all()) else f"a trial one-shot all-reduce summed to {trial[0]}"
    except (RuntimeError, ImportError) as error:
        problem = f"{type(error).__name__}: {error}"
    if not _all_ranks_agree(problem is None, cpu_group):
        return None, problem or "another rank could not set it up"
    return communicator, ""
