"""Keep the garbage collector out of a capture loop: collect once (or not, inside a step), freeze what survives,
collect the young after."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def freeze_gc(enable_gc: bool = False, *, collect_first: bool = True) -> Iterator[None]:
    """Collect, then freeze every surviving object for the block, then unfreeze and collect what the block made.

    Capturing many graphs allocates many short-lived Python objects; a collection in the middle of a capture walks
    every object the process holds (slow) and may free tensors whose memory the capture is using. Frozen objects
    are skipped by the collector, so what runs during the block is cheap. ``enable_gc=True`` leaves the collector
    exactly as it is (for hunting leaks). The closing collection walks the young generations only: the objects
    frozen for the block were collected on entry, and walking them again costs a full collection (about 0.15 s in
    a process that has imported the compiler stack). Note that ``gc.unfreeze`` also unfreezes objects frozen before
    the block.

    ``collect_first=False`` freezes what the process holds without collecting it first: for a block inside a step
    (a bucket captured on first use), where the entry's full collection would be most of the step's extra time.
    Garbage frozen with the rest is collected by the first full collection after the block.

    Example:
        >>> import gc
        >>> with freeze_gc():
        ...     gc.get_freeze_count() > 0
        True
    """
    if enable_gc:
        yield
        return
    if collect_first:
        gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.collect(1)
