"""Runner methods and attributes under their 0.1.0 names, kept one release with a ``DeprecationWarning``: calls of
the old names forward to the new ones, and a subclass that still overrides an old name is called under the new one.

A mixin of ``BaseCudaGraphRunner`` kept apart from it, so the class a step runs through holds only what a step
needs. The renames are rows of ``refactor/renames.toml`` (``own_name = true``): ``nox -s migrate`` rewrites calls and
overrides of the old names.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from .forward_batch import ForwardBatch
from .routing import Route
from .static_buffers import StaticBuffers

RENAMED_METHODS: dict[str, str] = {
    "capture_one_shape": "capture_bucket",
    "replay_graph": "replay_bucket",
    "replay_routed": "replay",
    "static_input_tensors": "static_buffer_tensors",
}
"""Runner methods renamed after cudagraph-runner 0.1.0 (old name: new name); the old names stay until 1.0.0."""


def _warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(
        f"{old}() is deprecated since cudagraph-runner 0.2.0 and will be removed in 1.0.0; use {new}() "
        f"(`nox -s migrate` rewrites calls and overrides)",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def _warn_renamed_attribute(old: str, new: str) -> None:
    warnings.warn(
        f"runner.{old} is deprecated since cudagraph-runner 0.2.0 and will be removed in 1.0.0; use runner.{new}",
        DeprecationWarning,
        stacklevel=3,
    )


def _beneath(runner: object, new: str) -> Callable[..., Any]:
    """The implementation of ``new`` that a deprecated alias forwards to: the one beneath an override that serves
    under both names (so that the override's ``super().old(...)`` reaches the real method, not itself)."""
    return getattr(type(runner), f"_{new}_beneath", None) or getattr(type(runner), new)


def _serve_under_new_name(cls: type, old: str, new: str) -> None:
    """Let ``cls``'s override of ``old`` answer calls of ``new`` too (``replay``'s ``route`` made optional)."""
    warnings.warn(
        f"{cls.__qualname__} overrides {old}(), renamed {new}() after cudagraph-runner 0.1.0; the override now "
        f"serves as {new}() (rename it: `nox -s migrate` does)",
        DeprecationWarning,
        stacklevel=4,
    )
    override = vars(cls)[old]
    setattr(cls, f"_{new}_beneath", getattr(super(cls, cls), new))
    if new == "replay":

        def replay(self: Any, batch: ForwardBatch, route: Route | None = None) -> torch.Tensor:
            return override(self, batch, self._taken_route(batch, route))  # type: ignore[no-any-return]

        setattr(cls, new, replay)
    else:
        setattr(cls, new, override)


class RenamedMethods:
    """The 0.1.0 names of the runner's methods (see the module docstring)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass that still overrides a method under its 0.1.0 name keeps working: the override serves under
        the new name too (the base calls the new name), with one ``DeprecationWarning`` naming the class."""
        super().__init_subclass__(**kwargs)
        for old, new in RENAMED_METHODS.items():
            if old in vars(cls) and new not in vars(cls):
                _serve_under_new_name(cls, old, new)

    def capture_one_shape(self, shape: int) -> torch.Tensor:
        """Deprecated alias of ``capture_bucket`` (removed in 1.0.0)."""
        _warn_renamed("capture_one_shape", "capture_bucket")
        return _beneath(self, "capture_bucket")(self, shape)  # type: ignore[no-any-return]

    def replay_graph(self, shape: int) -> torch.Tensor:
        """Deprecated alias of ``replay_bucket`` (removed in 1.0.0)."""
        _warn_renamed("replay_graph", "replay_bucket")
        return _beneath(self, "replay_bucket")(self, shape)  # type: ignore[no-any-return]

    @property
    def inputs(self) -> StaticBuffers:
        """Deprecated name of ``static_buffers`` (removed in 1.0.0)."""
        _warn_renamed_attribute("inputs", "static_buffers")
        return self.static_buffers  # type: ignore[attr-defined,no-any-return]

    @inputs.setter
    def inputs(self, buffers: StaticBuffers) -> None:
        _warn_renamed_attribute("inputs", "static_buffers")
        self.static_buffers = buffers

    def static_input_tensors(self, bucket: int) -> list[torch.Tensor]:
        """Deprecated alias of ``static_buffer_tensors`` (removed in 1.0.0)."""
        _warn_renamed("static_input_tensors", "static_buffer_tensors")
        return _beneath(self, "static_buffer_tensors")(self, bucket)  # type: ignore[no-any-return]

    def replay_routed(self, batch: ForwardBatch, route: Route) -> torch.Tensor:
        """Deprecated alias of ``replay(batch, route)`` (removed in 1.0.0)."""
        _warn_renamed("replay_routed", "replay")
        return _beneath(self, "replay")(self, batch, route)  # type: ignore[no-any-return]
