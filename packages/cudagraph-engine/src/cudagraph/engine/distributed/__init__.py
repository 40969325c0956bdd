"""Tensor parallelism for the reference engine on ``torch.distributed`` (NCCL on CUDA, gloo on CPU).

``group`` starts and stops one rank's process group (timeouts everywhere, teardown in order); ``all_reduce`` picks
how the model's all-reduces travel (symmetric-memory one-shot for small messages where it works, else the process
group); ``broadcast`` sends rank 0's steps to the other ranks; ``launcher`` spawns the ranks and brings them all
down when one fails. The sharded model itself is ``cudagraph.engine.model`` with a ``ShardPlan``.
"""

from .all_reduce import ALL_REDUCE_CHOICES, ONE_SHOT_MAX_BYTES, AllReduceChoice, choose_all_reduce
from .broadcast import DrivingModelRunner, StepBroadcaster, StepMessage, follow
from .environment import MULTICAST_OFF, disable_multicast
from .group import (
    BACKEND_BY_DEVICE,
    DEFAULT_TIMEOUT_S,
    TEARDOWN_STEPS,
    GroupCaptureBarrier,
    GroupOptions,
    TensorParallelGroup,
    TensorParallelTimeoutError,
    init_tensor_parallel,
    shutdown_tensor_parallel,
)
from .launcher import RankFailedError, RankOutcome, TorchrunRank, free_tcp_init_method, launch, torchrun_rank

__all__ = [
    "ALL_REDUCE_CHOICES",
    "BACKEND_BY_DEVICE",
    "DEFAULT_TIMEOUT_S",
    "MULTICAST_OFF",
    "ONE_SHOT_MAX_BYTES",
    "TEARDOWN_STEPS",
    "AllReduceChoice",
    "DrivingModelRunner",
    "GroupCaptureBarrier",
    "GroupOptions",
    "RankFailedError",
    "RankOutcome",
    "StepBroadcaster",
    "StepMessage",
    "TensorParallelGroup",
    "TensorParallelTimeoutError",
    "TorchrunRank",
    "choose_all_reduce",
    "disable_multicast",
    "follow",
    "free_tcp_init_method",
    "init_tensor_parallel",
    "launch",
    "shutdown_tensor_parallel",
    "torchrun_rank",
]
