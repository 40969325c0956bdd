"""When a forward can be graphed and how it is fed: decode runners keyed by batch size, prefill runners keyed by
token count.

A ``ForwardBatch`` enters a runner, is routed once (``route``: the bucket to replay, or why it runs eagerly), padded
and copied into static buffers, the attention backend's replay hook gets one ``ReplayMetadata``, the backend replays,
and the logits come out sliced to the real batch; every step is counted in the runner's ``ReplayMetrics``. The
engine-side contract is the ``Protocol``s in ``protocols``.
"""

from .base import BaseCudaGraphRunner
from .decode import DecodeCudaGraphRunner, get_batch_sizes_to_capture
from .draft import DraftCudaGraphRunner
from .draft_extend import DraftExtendCudaGraphRunner, DraftSeed
from .forward_batch import PADDING_KV_SLOT, PADDING_REQ_POOL_INDEX, ForwardBatch, ForwardMode
from .memory_plan import CaptureMemoryEstimate, ProbeCapture
from .metrics import BucketRow, EagerRow, ReplayMetrics
from .prefill import PrefillCudaGraphRunner
from .protocols import (
    AttentionBackendLike,
    DraftModelRunnerLike,
    GraphReadsModelRunner,
    HostLengthsHint,
    ModelRunnerLike,
    ModuleModelRunner,
    ReqToTokenPoolLike,
    TraceableDraftModelRunner,
    TraceableModelRunner,
)
from .replay_metadata import ReplayMetadata, bind_replay_hook
from .routing import EagerReason, Route, RouteTable, pad_to_bucket
from .static_buckets import StaticBucket, StaticBuckets
from .static_buffers import StaticBuffers
from .stats import BucketCaptureStats, CaptureStats, ShapeCaptureStats
from .step_inputs import StepInputs
from .switches import RunnerConfig, RunnerSwitches

__version__ = "0.1.0"

__all__ = [
    "PADDING_KV_SLOT",
    "PADDING_REQ_POOL_INDEX",
    "AttentionBackendLike",
    "BaseCudaGraphRunner",
    "BucketCaptureStats",
    "BucketRow",
    "CaptureMemoryEstimate",
    "CaptureStats",
    "DecodeCudaGraphRunner",
    "DraftCudaGraphRunner",
    "DraftExtendCudaGraphRunner",
    "DraftModelRunnerLike",
    "DraftSeed",
    "EagerReason",
    "EagerRow",
    "ForwardBatch",
    "ForwardMode",
    "GraphReadsModelRunner",
    "HostLengthsHint",
    "ModelRunnerLike",
    "ModuleModelRunner",
    "PrefillCudaGraphRunner",
    "ProbeCapture",
    "ReplayMetadata",
    "ReplayMetrics",
    "ReqToTokenPoolLike",
    "Route",
    "RouteTable",
    "RunnerConfig",
    "RunnerSwitches",
    "ShapeCaptureStats",
    "StaticBucket",
    "StaticBuckets",
    "StaticBuffers",
    "StepInputs",
    "TraceableDraftModelRunner",
    "TraceableModelRunner",
    "__version__",
    "bind_replay_hook",
    "get_batch_sizes_to_capture",
    "pad_to_bucket",
]
