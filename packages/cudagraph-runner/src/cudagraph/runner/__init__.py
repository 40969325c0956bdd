"""When a forward can be graphed and how it is fed: decode runners keyed by batch size, prefill runners keyed by token count."""

__version__ = "0.1.0"

__all__ = ["__version__"]
