"""The toy model runner: legacy attribute, method and class names throughout."""

from cudagraph.legacy import breakable_cuda_graph as bcg
from cudagraph.legacy.cuda_graph_runner import (
    PIECEWISE_CUDA_GRAPH_CAPTURE_FAILED_MSG,
    CudaGraphRunner,
    ForwardBatch,
    ForwardMode,
    PiecewiseCudaGraphRunner,
    get_batch_sizes_to_capture,
)
from cudagraph.legacy.server_args import Backend

from .forward_context import ForwardContext, get_forward_context


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


class ToyModelRunner:
    """Owns the graph runners; builds them only where CUDA exists."""

    graph_runner = None
    piecewise_cuda_graph_runner = None

    def __init__(self, config, device="cpu"):
        self.config = config
        self.device = device
        self.captured_shapes = []

    def init_device_graphs(self):
        """Build the decode graph runner (none without CUDA or with decode graphs off)."""
        if not _cuda_available() or not self.config.decode.enabled:
            self.graph_runner = None
            return
        self.graph_runner = CudaGraphRunner(self, self.config)

    def init_piecewise_cuda_graphs(self):
        """Build the prefill graph runner (it reads its backend, breakable or tc_piecewise, from the config)."""
        if not _cuda_available() or not self.config.prefill.enabled:
            self.piecewise_cuda_graph_runner = None
            return
        self.piecewise_cuda_graph_runner = PiecewiseCudaGraphRunner(self, self.config)

    def prefill_compiles(self) -> bool:
        """Whether the prefill backend compiles the model with torch.compile."""
        return self.config.prefill.backend is Backend.TCPIECEWISE

    def decode_batch_sizes(self):
        """The decode batch sizes this engine captures."""
        return get_batch_sizes_to_capture(self.config)

    def capture_one_batch_size(self, batch_size):
        """Record one capture (the toy has no real graph)."""
        self.captured_shapes.append(batch_size)
        return batch_size

    def capture_all(self):
        """Capture every decode batch size, largest first."""
        for batch_size in reversed(self.decode_batch_sizes()):
            self.capture_one_batch_size(batch_size)
        return self.captured_shapes

    def is_decode(self, batch: ForwardBatch) -> bool:
        """Whether ``batch`` is a decode step."""
        return batch.forward_mode is ForwardMode.DECODE

    def engine_context(self) -> ForwardContext:
        """The engine's own forward context (not the graph layer's)."""
        return get_forward_context()

    def in_breakable_graph(self) -> bool:
        """Whether a breakable capture is running."""
        return bcg.is_in_breakable_cuda_graph()

    def breakable_graph_type(self):
        """The breakable graph class the prefill backend uses."""
        return bcg.BreakableCUDAGraph

    def alias(self, tensor):
        """A non-owning alias of a CUDA tensor."""
        return bcg.weak_ref_tensor(tensor)

    @staticmethod
    def capture_failed_message() -> str:
        """The message logged when a tc_piecewise capture fails."""
        return PIECEWISE_CUDA_GRAPH_CAPTURE_FAILED_MSG


def graph_runner_of(model_runner):
    """The decode graph runner, for code that only has the attribute name."""
    return getattr(model_runner, "graph_runner", None)
