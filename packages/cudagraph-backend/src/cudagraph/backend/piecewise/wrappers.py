"""What stands in the split module for each piece and each split call: wrappers that read the graph dispatch.

Workflow: the ``PiecewiseCompiler`` hands every compiled piece to a ``PieceWrapper`` and every split-op submodule to a
``SplitCallWrapper``; both find the mode and shape of the forward being run with ``get_graph_dispatch()`` (a
hashable ``ShapeDescriptor``, as vLLM's ``CUDAGraphWrapper`` reads its ``BatchDescriptor``) and the recorder of that
shape in the ``Recordings`` they were made with:

1. no dispatch, or an eager one: the piece or the split submodule runs as compiled (warm-ups, shapes with no graph);
2. ``GraphMode.CAPTURE``: the piece runs inside the shape's open segment, the split call ends it and is recorded
   (see ``sequence``); a split op with a ``CapturePrefix`` first runs that part of its work inside the segment.

A replay never calls a wrapper: it runs the shape's ``ShapeSequence``. Not here: what the backend does with a
finished sequence, or splitting and compiling.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch.fx

from cudagraph.backend_utils import (
    CapturePrefix,
    GraphMode,
    ReplayBinder,
    ShapeDescriptor,
    break_options,
    get_graph_dispatch,
)

from .sequence import ShapeRecorder, SplitOpCall

__all__ = ["BindableOpCall", "PieceWrapper", "Recordings", "SplitCallWrapper"]


@dataclass
class Recordings:
    """The shapes being captured now, each with its recorder (one at a time in practice; keyed by descriptor)."""

    active: dict[ShapeDescriptor, ShapeRecorder] = field(default_factory=dict)

    def recorder(self, shape: ShapeDescriptor) -> ShapeRecorder:
        """The recorder of ``shape``; a ``RuntimeError`` when no capture of that shape is open."""
        recorder = self.active.get(shape)
        if recorder is None:
            raise RuntimeError(
                f"tc_piecewise: the forward runs in capture mode for {shape}, but no capture of that shape is open "
                f"(capture through the backend's capture_one, which opens it)"
            )
        return recorder


def _capturing(recordings: Recordings) -> ShapeRecorder | None:
    dispatch = get_graph_dispatch()
    if dispatch is None or dispatch.mode is not GraphMode.CAPTURE:
        return None
    return recordings.recorder(dispatch.shape)


@dataclass
class PieceWrapper:
    """One compiled piece: run as is, or inside the open segment of the shape being captured."""

    index: int
    runnable: Callable[..., Any]
    recordings: Recordings

    def __call__(self, *args: Any) -> Any:
        """Run the piece (inside the open segment when its shape is being captured)."""
        recorder = _capturing(self.recordings)
        if recorder is None:
            return self.runnable(*args)
        return recorder.piece(self.runnable, args)


@dataclass(frozen=True)
class BindableOpCall:
    """The one split-op call of a split submodule whose op has a ``ReplayBinder`` or a ``CapturePrefix``: which
    submodule arguments it takes, so the call can be bound at capture like a breakable break."""

    op: Any
    binder: ReplayBinder | None
    prefix: CapturePrefix | None
    node: torch.fx.Node
    placeholders: tuple[torch.fx.Node, ...]
    returns_nothing: bool
    """The submodule returns ``()``: the op writes its results in place, so the op can stand for the submodule."""

    @classmethod
    def of(cls, module: torch.fx.GraphModule) -> BindableOpCall | None:
        """The call, if ``module`` is exactly one call of a split op with a replay binder or a capture prefix (else
        ``None``)."""
        placeholders: list[torch.fx.Node] = []
        calls: list[torch.fx.Node] = []
        returned: Any = None
        for node in module.graph.nodes:
            if node.op == "placeholder":
                placeholders.append(node)
            elif node.op == "call_function":
                calls.append(node)
            elif node.op == "output":
                returned = node.args[0]
            else:
                return None
        if len(calls) != 1:
            return None
        options = break_options(calls[0].target)  # type: ignore[arg-type]
        if options is None or (options.replay_binder is None and options.capture_prefix is None):
            return None
        return cls(
            calls[0].target,
            options.replay_binder,
            options.capture_prefix,
            calls[0],
            tuple(placeholders),
            returns_nothing=returned in ((), [], None),
        )

    def arguments(self, module_args: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The op's arguments when the submodule is called with ``module_args``."""
        values = dict(zip(self.placeholders, module_args, strict=True))
        args = torch.fx.node.map_arg(self.node.args, values.__getitem__)
        kwargs = torch.fx.node.map_arg(self.node.kwargs, values.__getitem__)
        return tuple(args), dict(kwargs)

    def __call__(self, module_args: tuple[Any, ...]) -> SplitOpCall:
        """The op call the submodule makes for ``module_args``, for ``ShapeRecorder.split``."""
        args, kwargs = self.arguments(module_args)
        prefix = self.prefix if self.returns_nothing else None  # only an in-place op can stand for its submodule
        return SplitOpCall(self.op, args, kwargs, self.binder, prefix)


@dataclass
class SplitCallWrapper:
    """One split-op submodule: run as is, or ended-segment-and-recorded in the shape being captured."""

    index: int
    module: torch.fx.GraphModule
    recordings: Recordings
    bindable: BindableOpCall | None = None

    def __call__(self, *args: Any) -> Any:
        """Run the split call (ending the open segment and recorded when its shape is being captured)."""
        recorder = _capturing(self.recordings)
        if recorder is None:
            return self.module(*args)
        return recorder.split(f"tc_piecewise split {self.index}", self.module, args, self.bindable)
