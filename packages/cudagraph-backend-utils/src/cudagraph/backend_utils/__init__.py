"""Primitives shared by every backend: breakable capture, capture-state flags, the forward context, the graph memory
pool (``GraphPool``, the only owner of the allocator's pool hooks), capture options, gc freezing, weak references,
and bound Triton launches for eager breaks (``FastLauncher``, ``triton_launch``).

Everything imports on a machine without CUDA or Triton; what needs a device (capturing, pools, memory readings)
raises ``CudaGraphsUnavailableError`` there, and without Triton a ``FastLauncher`` launches through the JIT call.
"""

from .break_ops import (
    BreakOptions,
    CapturePrefix,
    ReplayBinder,
    break_options,
    is_split_op,
    register_break_op,
    register_split_op,
    registered_break_ops,
    registered_split_ops,
    split_op,
    unregister_break_op,
    unregister_split_op,
)
from .breakable_graph import (
    BreakableCUDAGraph,
    EagerBreakFunction,
    EagerCall,
    add_eager,
    breakable_capture,
    default_capture_stream,
    eager_break,
    force_split,
)
from .capture_options import CaptureOptions
from .capture_state import (
    compiled_model_forward,
    enable_tc_piecewise_cuda_graph,
    enable_torch_compile_warmup,
    is_capture_mode,
    is_in_breakable_cuda_graph,
    is_in_tc_piecewise_cuda_graph,
    is_in_torch_compile_warmup,
    model_capture_mode,
    use_compiled_model_forward,
)
from .captured_addresses import AddressRecord, TensorAddress, describe_moved
from .errors import BreakableCaptureError, CudaGraphsUnavailableError, exception_chain, require_cuda
from .forward_context import ForwardContext, ForwardContextScope, get_forward_context, set_forward_context
from .gc_control import freeze_gc
from .graph_dispatch import GraphDispatch, GraphMode, ShapeDescriptor, get_graph_dispatch, graph_dispatch
from .graph_pool import (
    CAPTURE_ERROR_MODES,
    GraphPool,
    GraphPoolHandle,
    capture_cuda_graph,
    get_global_graph_memory_pool,
    new_graph_pool,
    set_global_graph_memory_pool,
)
from .memory import (
    DeviceMemoryProbe,
    MemoryReading,
    free_device_memory,
    is_out_of_memory,
    read_device_memory,
    weak_ref_tensor,
    weak_ref_tensors,
)
from .replay import graph_replay_fn
from .sleep_memory import (
    MemoryTag,
    SleepMemory,
    SleepMemoryUnavailableError,
    sleep_memory_unavailable_reason,
)
from .triton_launch import (
    NATIVE_LAUNCH_VERSIONS,
    FastLauncher,
    cdiv,
    direct_launch,
    launch_values_and_key,
    next_power_of_2,
    through_jit,
)

__version__ = "0.1.0"

__all__ = [
    "CAPTURE_ERROR_MODES",
    "NATIVE_LAUNCH_VERSIONS",
    "AddressRecord",
    "BreakOptions",
    "BreakableCUDAGraph",
    "BreakableCaptureError",
    "CaptureOptions",
    "CapturePrefix",
    "CudaGraphsUnavailableError",
    "DeviceMemoryProbe",
    "EagerBreakFunction",
    "EagerCall",
    "FastLauncher",
    "ForwardContext",
    "ForwardContextScope",
    "GraphDispatch",
    "GraphMode",
    "GraphPool",
    "GraphPoolHandle",
    "MemoryReading",
    "MemoryTag",
    "ReplayBinder",
    "ShapeDescriptor",
    "SleepMemory",
    "SleepMemoryUnavailableError",
    "TensorAddress",
    "__version__",
    "add_eager",
    "break_options",
    "breakable_capture",
    "capture_cuda_graph",
    "cdiv",
    "compiled_model_forward",
    "default_capture_stream",
    "describe_moved",
    "direct_launch",
    "eager_break",
    "enable_tc_piecewise_cuda_graph",
    "enable_torch_compile_warmup",
    "exception_chain",
    "force_split",
    "free_device_memory",
    "freeze_gc",
    "get_forward_context",
    "get_global_graph_memory_pool",
    "get_graph_dispatch",
    "graph_dispatch",
    "graph_replay_fn",
    "is_capture_mode",
    "is_in_breakable_cuda_graph",
    "is_in_tc_piecewise_cuda_graph",
    "is_in_torch_compile_warmup",
    "is_out_of_memory",
    "is_split_op",
    "launch_values_and_key",
    "model_capture_mode",
    "new_graph_pool",
    "next_power_of_2",
    "read_device_memory",
    "register_break_op",
    "register_split_op",
    "registered_break_ops",
    "registered_split_ops",
    "require_cuda",
    "set_forward_context",
    "set_global_graph_memory_pool",
    "sleep_memory_unavailable_reason",
    "split_op",
    "through_jit",
    "unregister_break_op",
    "unregister_split_op",
    "use_compiled_model_forward",
    "weak_ref_tensor",
    "weak_ref_tensors",
]
