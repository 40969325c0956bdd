"""Resolve one canonical per-phase CUDA-graph mode from JSON, per-phase flags, legacy flags and keyword arguments. Pure Python: never imports torch."""

__version__ = "0.1.0"

__all__ = ["__version__"]
