"""Capture-state helpers the engine uses around its forward passes (legacy spellings)."""

import cudagraph.legacy.piecewise_context_manager as pcm
from cudagraph.legacy.cuda_graph_runner import (
    freeze_gc,
    get_global_graph_memory_pool,
    get_is_capture_mode,
    model_capture_mode,
    set_global_graph_memory_pool,
)
from cudagraph.legacy.piecewise_context_manager import (
    ForwardContext,
    get_forward_context,
    set_forward_context,
)


def capture_flags() -> dict:
    """Which capture states are on right now."""
    return {
        "capture": get_is_capture_mode(),
        "tc_piecewise": pcm.is_in_piecewise_cuda_graph(),
        "torch_compile_warmup": pcm.is_in_pcg_torch_compile(),
    }


def flags_while_capturing() -> dict:
    """The flags seen inside a capture."""
    with model_capture_mode():
        return capture_flags()


def flags_inside_tc_piecewise() -> dict:
    """The flags seen while a tc_piecewise graph runs."""
    with pcm.enable_piecewise_cuda_graph():
        return capture_flags()


def flags_during_compile_warmup() -> dict:
    """The flags seen during the torch.compile warmup."""
    with pcm.enable_piecewise_cuda_graph_compile():
        return capture_flags()


def run_with_forward_context(batch, attn_backend, step):
    """Call ``step()`` with the graph layer's forward context set to ``batch``."""
    with set_forward_context(ForwardContext(forward_batch=batch, attn_backend=attn_backend, extra={})):
        return step(get_forward_context())


def swap_memory_pool(pool):
    """Install ``pool`` as the shared graph memory pool; return the previous one."""
    previous = get_global_graph_memory_pool()
    set_global_graph_memory_pool(pool)
    return previous


def collect_without_gc(step):
    """Run ``step()`` with the garbage collector frozen, as graph capture does."""
    with freeze_gc():
        return step()
