"""When a forward can be graphed and how it is fed: decode runners keyed by batch size, prefill runners keyed by
token count.

A ``ForwardBatch`` enters a runner, is padded and copied into static buffers, the backend replays, and the logits
come out sliced to the real batch. The engine-side contract is the ``Protocol``s in ``protocols``.
"""

from .base import BaseCudaGraphRunner
from .buckets import get_batch_sizes_to_capture, pad_to_bucket
from .decode import DecodeCudaGraphRunner
from .forward_batch import PADDING_KV_SLOT, PADDING_REQ_POOL_INDEX, ForwardBatch, ForwardMode
from .prefill import PrefillCudaGraphRunner
from .protocols import AttentionBackendLike, ModelRunnerLike, ReqToTokenPoolLike
from .stats import CaptureStats, ShapeCaptureStats

__version__ = "0.1.0"

__all__ = [
    "PADDING_KV_SLOT",
    "PADDING_REQ_POOL_INDEX",
    "AttentionBackendLike",
    "BaseCudaGraphRunner",
    "CaptureStats",
    "DecodeCudaGraphRunner",
    "ForwardBatch",
    "ForwardMode",
    "ModelRunnerLike",
    "PrefillCudaGraphRunner",
    "ReqToTokenPoolLike",
    "ShapeCaptureStats",
    "__version__",
    "get_batch_sizes_to_capture",
    "pad_to_bucket",
]
