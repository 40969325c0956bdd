"""Builds the decode graph runner directly, as SGLang's own model runner does."""

from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner, get_is_capture_mode


def build_graph_runner(model_runner):
    runner = CudaGraphRunner(model_runner)
    runner.capture()
    return runner


def capturing_now():
    return get_is_capture_mode()
