"""The platform: SGLang asks it for its graph runner class and builds it as ``cls(model_runner)``."""

from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner
from sglang.srt.platforms.interface import SRTPlatform


class HookPlatform(SRTPlatform):
    """A platform that graphs decode steps with SGLang's runner (its kernels need no runner of their own)."""

    device_name = "hook"

    def get_graph_runner_cls(self) -> type:
        """The decode graph runner class the model runner builds."""
        return CudaGraphRunner


GRAPH_RUNNERS = {"decode": CudaGraphRunner}
"""The platform's runner classes by phase, for tools that list what a platform brings."""
