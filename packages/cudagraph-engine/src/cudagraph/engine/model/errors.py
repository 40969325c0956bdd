"""Errors raised while reading a model directory: each message names the file or tensor, what was wrong, and what is
allowed, in one line."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """A model directory, config or checkpoint that cannot be used (unsupported architecture, bad tensor, bad dtype)."""


class ModelFileNotFoundError(ModelLoadError, FileNotFoundError):
    """A file the model directory must contain (``config.json``, a safetensors shard) is missing."""


class TensorParallelError(ModelLoadError):
    """A tensor-parallel size the model cannot be split into (heads, KV heads or MLP width not divisible)."""
