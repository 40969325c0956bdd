"""Capture-state flags, the forward context and freeze_gc: context-scoped, nestable, per thread."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator

import pytest
from torch.utils._python_dispatch import TorchDispatchMode

from cudagraph.backend_utils import (
    BreakableCUDAGraph,
    ForwardContext,
    enable_tc_piecewise_cuda_graph,
    enable_torch_compile_warmup,
    freeze_gc,
    get_forward_context,
    is_capture_mode,
    is_in_breakable_cuda_graph,
    is_in_tc_piecewise_cuda_graph,
    is_in_torch_compile_warmup,
    model_capture_mode,
    set_forward_context,
)
from cudagraph.backend_utils.capture_state import breakable_cuda_graph_active

FLAGS = [
    (is_capture_mode, model_capture_mode),
    (is_in_tc_piecewise_cuda_graph, enable_tc_piecewise_cuda_graph),
    (is_in_torch_compile_warmup, enable_torch_compile_warmup),
    (is_in_breakable_cuda_graph, breakable_cuda_graph_active),
]


@pytest.mark.parametrize(("read", "enable"), FLAGS, ids=[read.__name__ for read, _ in FLAGS])
def test_flag_is_set_inside_and_restored_after_nesting(read, enable) -> None:
    assert read() is False
    with enable():
        assert read() is True
        with enable():
            assert read() is True
        assert read() is True
    assert read() is False


@pytest.mark.parametrize(("read", "enable"), FLAGS, ids=[read.__name__ for read, _ in FLAGS])
def test_flag_is_restored_after_an_exception(read, enable) -> None:
    with pytest.raises(ZeroDivisionError), enable():
        1 / 0  # noqa: B018
    assert read() is False


def test_flags_are_independent() -> None:
    with model_capture_mode():
        assert not is_in_tc_piecewise_cuda_graph()
        assert not is_in_torch_compile_warmup()
        assert not is_in_breakable_cuda_graph()


def test_flag_is_per_thread() -> None:
    seen_in_thread: list[bool] = []
    with model_capture_mode():
        worker = threading.Thread(target=lambda: seen_in_thread.append(is_capture_mode()))
        worker.start()
        worker.join()
        assert is_capture_mode()
    assert seen_in_thread == [False]


def test_forward_context_outside_one_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match=r"no forward context is set.*set_forward_context"):
        get_forward_context()


def test_forward_context_nests_and_restores() -> None:
    outer = ForwardContext(forward_batch="outer", attn_backend="backend")
    inner = ForwardContext(forward_batch="inner", extra={"layer": 3})
    with set_forward_context(outer) as entered:
        assert entered is outer
        assert get_forward_context() is outer
        with set_forward_context(inner):
            assert get_forward_context().extra == {"layer": 3}
        assert get_forward_context() is outer
    with pytest.raises(RuntimeError):
        get_forward_context()


def test_forward_context_defaults_do_not_share_extra() -> None:
    first, second = ForwardContext(), ForwardContext()
    first.extra["key"] = 1
    assert second.extra == {}
    assert first.forward_batch is None and first.attn_backend is None


def test_forward_context_is_per_thread() -> None:
    errors: list[str] = []

    def read_in_thread() -> None:
        try:
            get_forward_context()
        except RuntimeError as error:
            errors.append(str(error))

    with set_forward_context(ForwardContext(forward_batch=1)):
        worker = threading.Thread(target=read_in_thread)
        worker.start()
        worker.join()
    assert len(errors) == 1


def test_freeze_gc_freezes_inside_and_unfreezes_after() -> None:
    assert gc.get_freeze_count() == 0
    with freeze_gc():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_freeze_gc_unfreezes_after_an_exception() -> None:
    with pytest.raises(KeyError), freeze_gc():
        raise KeyError("boom")
    assert gc.get_freeze_count() == 0


def test_freeze_gc_with_gc_enabled_leaves_the_collector_alone() -> None:
    with freeze_gc(enable_gc=True):
        assert gc.get_freeze_count() == 0
        assert gc.isenabled()


def test_freeze_gc_collects_the_garbage_the_block_made() -> None:
    class Node:
        partner: object = None

    with freeze_gc():
        first, second = Node(), Node()
        first.partner, second.partner = second, first  # a cycle only the collector frees
        alive = weakref.ref(first)
        del first, second
    assert alive() is None


def _subclasses(cls: type) -> Iterator[type]:
    for subclass in cls.__subclasses__():
        yield subclass
        yield from _subclasses(subclass)


def test_the_breakable_captures_dispatch_modes_are_not_wrapped_by_dynamo() -> None:
    # torch wraps a dispatch mode's __torch_dispatch__ in torch._disable_dynamo unless the mode opts out; the
    # wrapper imports dynamo on a process's first capture and adds a frame to every op captured. The breakable
    # capture's modes are found by the module of its public class, so no private name is named here.
    capture_module = BreakableCUDAGraph.__module__
    modes = [mode for mode in _subclasses(TorchDispatchMode) if mode.__module__ == capture_module]
    assert modes, "the breakable capture's dispatch mode was not found"
    for mode in modes:
        dispatch = mode.__dict__["__torch_dispatch__"]
        assert dispatch.__qualname__ == f"{mode.__qualname__}.__torch_dispatch__"
        assert not hasattr(dispatch, "__wrapped__"), mode.__qualname__


@pytest.mark.parametrize("collect_first", [True, False])
def test_freeze_gc_collects_everything_on_entry_only_when_asked(
    collect_first: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    generations: list[int] = []
    real_collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda generation=2: generations.append(generation) or real_collect(generation))
    with freeze_gc(collect_first=collect_first):
        assert gc.get_freeze_count() > 0
    # The young generations are collected on leaving either way; the full walk on entry only with collect_first.
    assert generations == ([2, 1] if collect_first else [1])


def test_nested_freeze_gc_blocks_collect_once_and_keep_the_outer_block_frozen(monkeypatch) -> None:
    import gc

    from cudagraph.backend_utils import gc_control

    full_collections = []
    real_collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *generation: full_collections.append(generation) or real_collect(1))
    with gc_control.freeze_gc():
        frozen = gc.get_freeze_count()
        with gc_control.freeze_gc():
            pass
        assert gc.get_freeze_count() == frozen  # the inner block did not unfreeze the outer one's objects
        with gc_control.freeze_gc():
            pass
    assert full_collections.count(()) == 1  # one full collection on entry, for three captures
    assert gc.get_freeze_count() == 0
