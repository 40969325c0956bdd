"""Rank 0 drives the batch loop; every step it runs is sent to the other ranks first, which run the same step.

A ``StepMessage`` carries the ``ForwardBatch`` (its tensors on the host) and the request-to-token edits rank 0's
scheduler made since the last step, over the group's host-side (gloo) channel. The other ranks apply the edits to
their own table, move the batch to their device and run it, so every rank replays the same graph or takes the same
eager path in the same order, and the collectives inside meet.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from cudagraph.runner import ForwardBatch

from ..kv_cache import ReqToTokenEdit
from ..model_runner import ModelRunner
from .group import TensorParallelGroup

SOURCE_RANK = 0
"""The rank that schedules and sends."""


@dataclass(frozen=True)
class StepMessage:
    """One step for the other ranks: the batch's fields (tensors on the host) and the table edits before it."""

    batch_fields: dict[str, Any]
    edits: list[ReqToTokenEdit]

    @classmethod
    def of(cls, batch: ForwardBatch, edits: list[ReqToTokenEdit]) -> StepMessage:
        """The message for ``batch`` (device tensors copied to the host)."""
        fields = {
            item.name: _to_host(getattr(batch, item.name))
            for item in dataclasses.fields(batch)
            if item.name != "attn_metadata"
        }
        return cls(fields, edits)

    def batch_on(self, device: torch.device) -> ForwardBatch:
        """The batch with its tensors on ``device`` (``seq_lens_cpu`` stays on the host, as the engine builds it)."""
        fields: dict[str, Any] = {
            name: value.to(device) if isinstance(value, torch.Tensor) and name != "seq_lens_cpu" else value
            for name, value in self.batch_fields.items()
        }
        return ForwardBatch(**fields)


def _to_host(value: Any) -> Any:
    return value.to("cpu") if isinstance(value, torch.Tensor) else value


class StepBroadcaster:
    """The host-side channel of one group: ``send`` and ``stop`` on the source rank, ``receive`` on the others."""

    def __init__(self, group: TensorParallelGroup) -> None:
        self.group = group

    def send(self, message: StepMessage | None) -> None:
        """Send ``message`` (``None``: no more steps) from the source rank to every other rank."""
        dist.broadcast_object_list([message], src=SOURCE_RANK, group=self.group.cpu_group)

    def stop(self) -> None:
        """Tell the other ranks that no more steps follow."""
        self.send(None)

    def receive(self) -> StepMessage | None:
        """The next step from the source rank, or ``None`` when it stopped."""
        box: list[StepMessage | None] = [None]
        dist.broadcast_object_list(box, src=SOURCE_RANK, group=self.group.cpu_group)
        return box[0]


class DrivingModelRunner(ModelRunner):
    """Rank 0's model runner: every step it runs is first sent to the other ranks (with the table edits the
    scheduler made since the last one). Its request-to-token pool records edits from construction on."""

    def __init__(self, *args: Any, broadcaster: StepBroadcaster, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.broadcaster = broadcaster
        self.req_to_token_pool.start_recording()

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Send ``batch``, then run it here."""
        self.broadcaster.send(StepMessage.of(batch, self.req_to_token_pool.take_edits()))
        return super().run(batch)


def follow(model_runner: ModelRunner, broadcaster: StepBroadcaster) -> int:
    """Run every step the source rank sends until it stops; the number of steps run."""
    steps = 0
    while (message := broadcaster.receive()) is not None:
        for edit in message.edits:
            model_runner.req_to_token_pool.apply(edit)
        model_runner.run(message.batch_on(model_runner.device))
        steps += 1
    return steps
