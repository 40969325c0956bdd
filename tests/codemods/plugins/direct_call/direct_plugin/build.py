"""Builds the decode graph runner directly, as SGLang's own model runner does, for a model the plugin serves."""

from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner


def build_graph_runner(model_runner):
    """The decode graph runner of ``model_runner``, captured (``None`` with graphs disabled)."""
    if model_runner.server_args.disable_cuda_graph:
        return None
    return CudaGraphRunner(model_runner)
