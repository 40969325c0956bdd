"""Capture-state flags, the forward context, the memory pool and gc freezing, on the CPU."""

import gc

import pytest

from toy_engine import capture_state


def test_flags_are_off_outside_any_capture():
    assert capture_state.capture_flags() == {"capture": False, "tc_piecewise": False, "torch_compile_warmup": False}


def test_each_context_turns_on_its_own_flag_only():
    assert capture_state.flags_while_capturing() == {"capture": True, "tc_piecewise": False, "torch_compile_warmup": False}
    assert capture_state.flags_inside_tc_piecewise()["tc_piecewise"] is True
    assert capture_state.flags_during_compile_warmup()["torch_compile_warmup"] is True
    assert capture_state.capture_flags()["capture"] is False


def test_forward_context_is_visible_inside_and_gone_after():
    batch, backend = object(), object()
    seen = capture_state.run_with_forward_context(batch, backend, lambda context: context)
    assert seen.forward_batch is batch and seen.attn_backend is backend
    from cudagraph.legacy.piecewise_context_manager import get_forward_context

    with pytest.raises(RuntimeError):
        get_forward_context()


def test_memory_pool_get_and_set():
    pool = object()
    previous = capture_state.swap_memory_pool(pool)
    try:
        assert capture_state.swap_memory_pool(previous) is pool
    finally:
        capture_state.swap_memory_pool(previous)


def test_freeze_gc_freezes_survivors_inside_and_restores_after():
    was_enabled = gc.isenabled()
    assert capture_state.collect_without_gc(gc.get_freeze_count) > 0
    assert gc.isenabled() == was_enabled
