"""Keep the garbage collector out of a capture loop: collect once (or not, inside a step), freeze what survives,
collect the young after."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

_depth = 0
"""How many ``freeze_gc`` blocks are open (only the outermost collects, freezes and unfreezes)."""


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

    Blocks nest: an inner block (another runner's capture inside an engine's) does nothing, so the outer block's
    single collection serves every capture in it.

    Example:
        >>> import gc
        >>> with freeze_gc():
        ...     with freeze_gc():
        ...         pass
        ...     gc.get_freeze_count() > 0
        True
    """
    global _depth
    if enable_gc or _depth:
        # Inside another freeze_gc block the objects are frozen already: nothing to collect, and unfreezing here
        # would unfreeze the outer block's objects too. Several captures in one block pay for one collection.
        yield
        return
    if collect_first:
        gc.collect()
    gc.freeze()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        gc.unfreeze()
        gc.collect(1)
