"""What the engine tells ``resolve`` about where the graphs will run; the compatibility rules read it."""

from __future__ import annotations

from dataclasses import dataclass

from .vocabulary import ConfigError


@dataclass(frozen=True)
class Environment:
    """A description of the engine and device, read by the compatibility rules and the default bucket sizes.

    The defaults describe a plain CUDA engine, where no rule applies; ``resolve`` uses them when no environment is
    given. ``gpu_memory_gib`` (total memory of one GPU) picks the default largest decode batch when known.
    """

    device_type: str = "cuda"
    """torch device type (``"cuda"``, ``"cpu"``, ``"mps"``...); an index suffix such as ``"cuda:1"`` is allowed."""
    pipeline_parallel_size: int = 1
    lora: bool = False
    """LoRA adapters are served."""
    multimodal: bool = False
    """The model takes image, audio or video inputs."""
    mla_attention: bool = False
    """The model uses multi-head latent attention (DeepSeek-style)."""
    torch_compile: bool = False
    """The whole model is wrapped in ``torch.compile``."""
    gpu_memory_gib: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.device_type, str) or not self.device_type:
            raise ConfigError(f"Environment.device_type: {self.device_type!r} is not a device type; e.g. 'cuda', 'cpu'")
        size = self.pipeline_parallel_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"Environment.pipeline_parallel_size: {size!r} is not allowed; allowed: integers >= 1")
        memory = self.gpu_memory_gib
        if memory is not None and (isinstance(memory, bool) or not isinstance(memory, (int, float)) or memory <= 0):
            raise ConfigError(
                f"Environment.gpu_memory_gib: {memory!r} is not allowed; allowed: a positive number or None"
            )

    @property
    def is_cuda(self) -> bool:
        """Whether the device is a CUDA device (ROCm devices also report ``cuda``)."""
        return self.device_type.split(":", 1)[0] == "cuda"
