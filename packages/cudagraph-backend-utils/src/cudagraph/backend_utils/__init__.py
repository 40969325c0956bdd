"""Primitives shared by every backend: breakable capture, capture-state flags, the forward context, the shared graph memory pool, gc freezing and weak references."""

__version__ = "0.1.0"

__all__ = ["__version__"]
