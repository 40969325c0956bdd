"""A reference Llama/Qwen-family engine (paged KV cache, torch and FlashInfer attention) that proves the runners on real forwards."""

__version__ = "0.1.0"

__all__ = ["__version__"]
