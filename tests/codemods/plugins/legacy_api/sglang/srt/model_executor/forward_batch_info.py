"""SGLang's forward batch (stand-in): the fields the graph runners read."""

import dataclasses
import enum

import torch


class CaptureHiddenMode(enum.IntEnum):
    """Which hidden states a forward pass returns; a graph captured for one mode replays only that mode."""

    NULL = 0
    LAST = 1
    FULL = 2


@dataclasses.dataclass
class ForwardBatch:
    """One decode step's inputs."""

    input_ids: torch.Tensor
    capture_hidden_mode: CaptureHiddenMode = CaptureHiddenMode.NULL
    spec_info: object = None

    @property
    def batch_size(self) -> int:
        """Requests in the batch (one token each in decode)."""
        return len(self.input_ids)
