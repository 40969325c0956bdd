"""Start and stop the tensor-parallel process group of one rank: ``torch.distributed`` with NCCL on CUDA and gloo
on CPU, a gloo group beside it for host-side messages (batches, barriers), and the model's communicator.

Every wait has a timeout: a peer that died or hangs turns into an error on this rank, never a hang. Teardown runs in
order (release graphs, synchronize the device, meet the other ranks, drop the communicator, destroy the groups), each
step bounded by the same timeout.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType

import torch
import torch.distributed as dist

from ..model import ShardPlan
from ..model.collectives import register_communicator, unregister_communicator
from .all_reduce import AllReduceChoice, choose_all_reduce
from .environment import disable_multicast

logger = logging.getLogger(__name__)

BACKEND_BY_DEVICE = MappingProxyType({"cuda": "nccl", "cpu": "gloo"})
"""The ``torch.distributed`` backend of the model's collectives, by device type."""

DEFAULT_TIMEOUT_S = 300.0
"""How long a collective, a barrier or a teardown step may wait for the other ranks."""


class TensorParallelTimeoutError(RuntimeError):
    """A step of start-up or teardown that waits on the other ranks did not finish within the timeout."""


@dataclass(frozen=True)
class GroupOptions:
    """How one rank joins its group: ``init_method`` (``tcp://host:port`` or ``env://`` under torchrun)."""

    rank: int
    world_size: int
    device: torch.device
    init_method: str = "env://"
    timeout_s: float = DEFAULT_TIMEOUT_S
    all_reduce: str = "auto"


@dataclass
class TensorParallelGroup:
    """One rank's membership: the model's process group, the host-side group, and the all-reduce choice."""

    rank: int
    world_size: int
    device: torch.device
    group: dist.ProcessGroup
    """The model's collectives (NCCL or gloo)."""
    cpu_group: dist.ProcessGroup
    """Host-side messages and barriers (gloo; the same group as ``group`` on CPU)."""
    timeout_s: float
    all_reduce: AllReduceChoice | None = None
    _closed: bool = field(default=False, repr=False)

    @property
    def group_name(self) -> str:
        """The name the model's collective operators resolve."""
        return str(self.group.group_name)

    def shard_plan(self, moe_a2a_backend: str = "none") -> ShardPlan:
        """This rank's part of the model, its sparse blocks reaching their experts as ``moe_a2a_backend`` says
        (``MOE_A2A_BACKENDS``)."""
        return ShardPlan(
            rank=self.rank, size=self.world_size, group_name=self.group_name, moe_a2a_backend=moe_a2a_backend
        )

    def barrier(self) -> None:
        """Meet every other rank on the host (gloo), or fail naming who did not come within the timeout."""
        dist.monitored_barrier(group=self.cpu_group, timeout=timedelta(seconds=self.timeout_s))

    @property
    def capture_barrier(self) -> GroupCaptureBarrier:
        """What a graph runner on this rank captures with (``capture_barrier=``): the group's barrier, which also
        shares the capture's decisions, so every rank captures and keeps the same buckets."""
        return GroupCaptureBarrier(self)

    def agree_min(self, values: Sequence[int]) -> list[int]:
        """The element-wise minimum of ``values`` over every rank (host side, gloo)."""
        tensor = torch.tensor(list(values), dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return [int(value) for value in tensor.tolist()]

    def warm_collectives(self, dtype: torch.dtype, largest_elements: int, all_to_all: bool = False) -> int:
        """All-reduce one message of each size from 1 Ki elements up to ``largest_elements`` (4x apart) on the
        process group (and with ``all_to_all``, the experts' token exchange, one all-to-all, which sets up NCCL's
        peer-to-peer connections), before anything is captured; the device bytes that took (0 on CPU).

        NCCL sets up its buffers for a size range (its channels and protocols) the first time a message of that
        range travels. Done here, they are set up once per group at start-up, shared by every graph and every
        eager step; left to the first capture, they would be counted as graph memory (and in the capture
        estimate's probes) though no graph owns them."""
        if self.device.type != "cuda":
            return 0
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()  # blocks cached before (a model's load) would otherwise come back inside the reading
        free_before, _ = torch.cuda.mem_get_info(self.device)
        message = torch.zeros(max(largest_elements, 1), dtype=dtype, device=self.device)
        elements = 1024
        while True:
            dist.all_reduce(message[: min(elements, message.numel())], group=self.group)
            if elements >= message.numel():
                break
            elements *= 4
        if all_to_all:
            blocks = message[: self.world_size * (message.numel() // self.world_size)].view(self.world_size, -1)
            dist.all_to_all_single(torch.empty_like(blocks), blocks, group=self.group)
        torch.cuda.synchronize(self.device)
        del message
        torch.cuda.empty_cache()
        free_after, _ = torch.cuda.mem_get_info(self.device)
        return max(0, free_before - free_after)

    def choose_all_reduce(self, requested: str, dtype: torch.dtype, max_message_elements: int) -> AllReduceChoice:
        """Pick and register the model's communicator (see ``all_reduce.choose_all_reduce``); logged once."""
        choice = choose_all_reduce(requested, self.group, self.cpu_group, self.device, dtype, max_message_elements)
        register_communicator(self.group_name, choice.communicator)
        self.all_reduce = choice
        if self.rank == 0:
            logger.info(
                "tensor parallel size %d: %s (%s)", self.world_size, choice.communicator.describe(), choice.reason
            )
        return choice


@dataclass(frozen=True)
class GroupCaptureBarrier:
    """A group's capture barrier (``__call__``: meet every rank) that also agrees (``agree_min``): a
    ``cudagraph.runner.agreement.RankAgreement``, so a runner given it shares every capture decision with the other
    ranks."""

    group: TensorParallelGroup

    def __call__(self) -> None:
        """Meet every other rank on the host."""
        self.group.barrier()

    def agree_min(self, values: Sequence[int]) -> list[int]:
        """The element-wise minimum of ``values`` over every rank."""
        return self.group.agree_min(values)


def init_tensor_parallel(options: GroupOptions) -> TensorParallelGroup:
    """Join the group as ``options.rank`` (binding ``options.device`` first on CUDA), with timeouts set."""
    disable_multicast()
    device = options.device
    backend = BACKEND_BY_DEVICE.get(device.type)
    if backend is None:
        raise ValueError(f"tensor parallel runs on {', '.join(BACKEND_BY_DEVICE)} devices, not {device.type}")
    timeout = timedelta(seconds=options.timeout_s)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        init_method=options.init_method,
        rank=options.rank,
        world_size=options.world_size,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )
    group = dist.group.WORLD
    assert group is not None
    cpu_group = group if backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    return TensorParallelGroup(options.rank, options.world_size, device, group, cpu_group, options.timeout_s)


def run_with_timeout(
    step: Callable[[], object], what: str, timeout_s: float, device: torch.device | None = None
) -> None:
    """Run ``step`` in a helper thread (bound to ``device`` when it is a GPU); raise ``TensorParallelTimeoutError``
    naming ``what`` if it overruns (the thread is a daemon, so a stuck step cannot keep the process alive)."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            if device is not None and device.type == "cuda":
                torch.cuda.set_device(device)
            step()
        except BaseException as error:  # re-raised in the caller's thread
            failure.append(error)

    thread = threading.Thread(target=target, name=f"tp-{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TensorParallelTimeoutError(f"{what} did not finish within {timeout_s:g} s")
    if failure:
        raise failure[0]


TEARDOWN_STEPS = ("release graphs", "synchronize the device", "meet the other ranks", "destroy the process group")
"""Teardown, in order: a step that overruns its timeout stops the teardown with an error naming it."""


def shutdown_tensor_parallel(group: TensorParallelGroup, release_graphs: Callable[[], None] | None = None) -> None:
    """Tear down in ``TEARDOWN_STEPS`` order; idempotent. ``release_graphs`` frees this rank's CUDA graphs (graphs
    that captured collectives must go before the communicator they replay on)."""
    if group._closed:
        return
    group._closed = True

    def synchronize() -> None:
        if group.device.type == "cuda":
            torch.cuda.synchronize(group.device)

    def destroy() -> None:
        unregister_communicator(group.group_name)
        if group.all_reduce is not None:
            group.all_reduce.communicator.close()
        if dist.is_initialized():
            dist.destroy_process_group()

    steps = dict(
        zip(TEARDOWN_STEPS, (release_graphs or (lambda: None), synchronize, group.barrier, destroy), strict=True)
    )
    for what, step in steps.items():
        run_with_timeout(step, f"tensor-parallel teardown on rank {group.rank}: {what}", group.timeout_s, group.device)
