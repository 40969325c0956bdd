"""A reference Llama/Qwen-family engine (paged KV cache, torch and FlashInfer attention) that proves the runners on
real forwards.

``model_runner.ModelRunner`` runs steps (graphs where they apply), ``generate.generate`` batches requests
continuously, and ``cudagraph-engine`` (``commands``) drives both from the command line. ``attention`` is the
attention backends' graph-facing side (what an engine author copies, with ``model_runner``'s shape and
``kv_cache``'s padding convention); ``kernels`` and ``model`` compute the forwards that prove the layer. Measuring
lives in ``bench/`` of a source checkout, not here.
"""

from .attention import ATTENTION_BACKENDS, TorchAttentionBackend, make_attention_backend, unified_attention
from .batch import Request, SamplingParams, make_decode_batch, make_extend_batch
from .generate import GenerationOutput, Scheduler, generate
from .kv_cache import CacheFullError, ReqToTokenPool, TokenToKVPool
from .model_runner import CacheConfig, ModelRunner

__version__ = "0.1.0"

__all__ = [
    "ATTENTION_BACKENDS",
    "CacheConfig",
    "CacheFullError",
    "GenerationOutput",
    "ModelRunner",
    "ReqToTokenPool",
    "Request",
    "SamplingParams",
    "Scheduler",
    "TokenToKVPool",
    "TorchAttentionBackend",
    "__version__",
    "generate",
    "make_attention_backend",
    "make_decode_batch",
    "make_extend_batch",
    "unified_attention",
]
