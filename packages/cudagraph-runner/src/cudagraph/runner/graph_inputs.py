"""The tensors a runner's graphs read that the runner does not own, and the check that they are still where the
graphs were captured to read them.

A graph reads the runner's static buffers (which never move while it holds graphs) and the engine's state: the
model's parameters and buffers, the KV cache, the request-to-token table. ``graph_read_tensors(model_runner)`` names
the latter: the model runner's own ``graph_read_tensors()`` when it has one (the reference engine's lists its
weights, buffers and caches), else its ``model``'s parameters and buffers.

``GraphInputGuard`` records, per captured bucket, the ``AddressRecord`` of those tensors (one record per capture
session, shared by its graphs) and answers which buckets read tensors that moved since (``stale()``). Nothing here
runs per step: a weight update that copies into the same memory moves nothing, and whoever gives a tensor new
memory says so (``ModelRunner.update_weights``, a wake), which is when the check runs. In debug mode the runner also
checks before every replay.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from cudagraph.backend_utils import AddressRecord, describe_moved

from .protocols import GraphReadsModelRunner, ModelRunnerLike, ModuleModelRunner

GraphTensors = Callable[[], Mapping[str, torch.Tensor]]
"""A zero-argument callable naming the tensors a runner's graphs read beyond its static buffers."""


class GraphInputsMovedError(RuntimeError):
    """A graph would replay over tensors that moved since it was captured (new weights' memory, a re-allocated
    cache): replaying it would read stale or freed memory. The message names the tensors and the fix."""


def graph_read_tensors(model_runner: ModelRunnerLike) -> Mapping[str, torch.Tensor]:
    """What the graphs of ``model_runner``'s runners read beyond their static buffers, by name (see the module
    docstring); empty when the model runner names nothing (``GraphReadsModelRunner``) and holds no
    ``torch.nn.Module`` ``model`` (``ModuleModelRunner``)."""
    if isinstance(model_runner, GraphReadsModelRunner):
        return dict(model_runner.graph_read_tensors())
    if isinstance(model_runner, ModuleModelRunner) and isinstance(model_runner.model, torch.nn.Module):
        tensors: dict[str, torch.Tensor] = dict(model_runner.model.named_parameters(remove_duplicate=False))
        tensors.update(model_runner.model.named_buffers(remove_duplicate=False))
        return tensors
    return {}


class GraphInputGuard:
    """The address records of one runner's graphs (see the module docstring)."""

    def __init__(self, tensors: GraphTensors) -> None:
        self._tensors = tensors
        self.recorded: dict[int, AddressRecord] = {}
        """Per captured bucket, where its graph's inputs were when it was captured."""
        self._session: AddressRecord | None = None

    def now(self) -> AddressRecord:
        """The addresses of the graph-read tensors now."""
        return AddressRecord.of(self._tensors())

    def start_session(self) -> None:
        """The next ``record`` reads the addresses afresh (a capture session starts; weights may have moved)."""
        self._session = None

    def record(self, bucket: int) -> None:
        """Keep where the graph of ``bucket``, just captured, reads its inputs (once per session, shared)."""
        if self._session is None:
            self._session = self.now()
        self.recorded[bucket] = self._session

    def forget(self, bucket: int) -> None:
        """Drop the record of ``bucket`` (its graph was released)."""
        self.recorded.pop(bucket, None)

    def clear(self) -> None:
        """Drop every record (every graph was released)."""
        self.recorded.clear()
        self._session = None

    def stale(self) -> dict[int, tuple[str, ...]]:
        """Per bucket whose graph reads tensors that moved since its capture, their names (empty: all current)."""
        if not self.recorded:
            return {}
        now = self.now()
        moved_by_record: dict[int, tuple[str, ...]] = {}
        stale: dict[int, tuple[str, ...]] = {}
        for bucket, record in self.recorded.items():
            moved = moved_by_record.get(id(record))
            if moved is None:
                moved = moved_by_record[id(record)] = record.moved(now)
            if moved:
                stale[bucket] = moved
        return stale

    def check(self, bucket: int, phase: object) -> None:
        """Raise ``GraphInputsMovedError`` when the graph of ``bucket`` reads tensors that moved (debug replays)."""
        record = self.recorded.get(bucket)
        if record is None:
            return
        moved = record.moved(self.now())
        if moved:
            raise moved_error(phase, {bucket: moved})


def moved_error(phase: object, stale: Mapping[int, tuple[str, ...]]) -> GraphInputsMovedError:
    """The one error for graphs of ``phase`` whose inputs moved (``stale``: bucket -> moved tensor names)."""
    names = tuple(sorted({name for moved in stale.values() for name in moved}))
    return GraphInputsMovedError(
        f"{phase} CUDA graphs of buckets {sorted(stale)} read tensors that moved since they were captured "
        f"({describe_moved(names)}): replaying them would read stale or freed memory. Update weights in place "
        "(ModelRunner.update_weights copies into the same memory), or recapture (runner.refresh_graphs(), "
        "the default when weights move)"
    )
