"""``exception_chain``: the one walk of an error's causes and contexts that ``is_out_of_memory`` and the runner's
``drop_failed_frames`` share. Every link comes once, a cycle ends the walk."""

from __future__ import annotations

import torch

from cudagraph.backend_utils import exception_chain, is_out_of_memory


def raised(error: BaseException, *, cause: BaseException | None = None, context: BaseException | None = None) -> None:
    """Link ``error`` to ``cause`` and ``context`` as ``raise error from cause`` inside ``except context`` would."""
    error.__cause__ = cause
    error.__context__ = context


def test_the_chain_is_the_error_then_its_causes_and_contexts_each_once() -> None:
    root = KeyError("slot")
    middle = ValueError("bad shape")
    top = RuntimeError("capture failed")
    raised(middle, context=root)
    raised(top, cause=middle, context=middle)  # `raise ... from` inside the handler: both links name one error
    assert list(exception_chain(top)) == [top, middle, root]
    assert list(exception_chain(root)) == [root]


def test_a_cause_comes_before_a_context_and_both_are_walked() -> None:
    cause, context = ValueError("cause"), KeyError("context")
    top = RuntimeError("top")
    raised(top, cause=cause, context=context)
    assert list(exception_chain(top)) == [top, cause, context]


def test_a_suppressed_context_is_still_in_the_chain() -> None:
    try:
        try:
            raise KeyError("slot")
        except KeyError:
            raise RuntimeError("capture failed") from None
    except RuntimeError as error:
        assert error.__suppress_context__
        assert [type(link) for link in exception_chain(error)] == [RuntimeError, KeyError]


def test_a_cycle_in_the_chain_ends_the_walk() -> None:
    first, second = RuntimeError("first"), ValueError("second")
    raised(first, cause=second)
    raised(second, context=first)  # first -> second -> first
    assert list(exception_chain(first)) == [first, second]
    raised(first, cause=first, context=first)  # its own cause and context
    assert list(exception_chain(first)) == [first]


def test_out_of_memory_is_found_anywhere_in_the_chain() -> None:
    """Through the context of an error that also names a (different) cause: both links are walked."""
    out_of_memory = torch.OutOfMemoryError("CUDA out of memory")
    top = RuntimeError("capture failed")
    raised(top, cause=ValueError("capture_end failed"), context=out_of_memory)
    assert is_out_of_memory(top)
    raised(top, cause=ValueError("capture_end failed"), context=KeyError("slot"))
    assert not is_out_of_memory(top)
