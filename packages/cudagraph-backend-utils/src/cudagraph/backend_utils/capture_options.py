"""The switches of a capture, in one frozen dataclass passed in (never read from globals deep inside)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from .graph_pool import CAPTURE_ERROR_MODES

_DEBUG_FROM_ENVIRONMENT = os.environ.get("CUDAGRAPH_BREAKABLE_DEBUG", "").strip() not in ("", "0", "false", "False")


@dataclass(frozen=True)
class CaptureOptions:
    """How shapes are captured: one value given to a backend (and by it to the breakable primitive).

    Example:
        >>> options = CaptureOptions(debug=True, num_warmups=1)
        >>> options.weak_ref_outputs, options.freeze_gc
        (True, True)
    """

    num_warmups: int = 2
    """Eager runs of the forward before each capture (lazy initialization, autotuning, allocator warm-up)."""
    debug: bool = _DEBUG_FROM_ENVIRONMENT
    """Record input addresses at capture and check them before every replay (static inputs of a shape, tensor
    arguments of eager breaks), and record segment ops for error messages. Adds checks, never changes results.
    Default: the environment variable ``CUDAGRAPH_BREAKABLE_DEBUG``, read once at import."""
    weak_ref_outputs: bool = True
    """Hold each shape's output without pinning its pool memory, so smaller shapes reuse it (``False`` keeps every
    output alive: many shapes then cost many times the memory)."""
    freeze_gc: bool = True
    """Collect once and freeze the garbage collector for the capture loop (``False`` leaves it running, for leak
    hunting)."""
    capture_error_mode: str = "global"
    """``cudaStreamCaptureMode``: ``global`` (catches unsafe calls from any thread), ``thread_local`` or ``relaxed``."""
    split_every_op: bool = False
    """Breakable only: end a segment after every op (one op per graph), to bisect which op breaks a capture."""
    barrier: Callable[[], None] | None = None
    """Breakable only: called before each eager break while capturing (e.g. a process-group barrier, so ranks
    capturing at different speeds meet before an eager collective); never at replay."""

    def __post_init__(self) -> None:
        if self.num_warmups < 0:
            raise ValueError(f"num_warmups must be >= 0, got {self.num_warmups}")
        if self.capture_error_mode not in CAPTURE_ERROR_MODES:
            raise ValueError(
                f"capture_error_mode {self.capture_error_mode!r} is not one of {', '.join(CAPTURE_ERROR_MODES)}"
            )
