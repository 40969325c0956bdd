"""Test helpers for code built on the engine: record the aten ops a piece of code dispatches, and run the attention
break unbound (as a replay that dispatches its op). For tests and benchmarks, never for production."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from .attention import op as attention_op

__all__ = ["DispatchedOps", "unbound_attention"]


class DispatchedOps(TorchDispatchMode):
    """Records every aten op dispatched while active.

    ``calls`` counts them by overload packet (``aten.add``); ``computed`` lists, in order and by full overload name
    (``aten.add.Tensor``), those that are not views: on a GPU each of those is a kernel launch, a view moves no data.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()
        self.computed: list[str] = []

    def __torch_dispatch__(
        self,
        func: Callable[..., Any],
        types: object,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """Record ``func``, then run it."""
        self.calls[str(func.overloadpacket)] += 1  # type: ignore[attr-defined]
        if not func.is_view:  # type: ignore[attr-defined]
            self.computed.append(str(func))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def unbound_attention() -> Iterator[None]:
    """``unified_attention`` registered without its replay binder while active, so a breakable replay dispatches the
    op and reads the forward context (the path before binding); the binder is registered again on exit."""
    attention_op.register_split_op(attention_op.unified_attention)
    try:
        yield
    finally:
        attention_op.register_split_op(
            attention_op.unified_attention, replay_binder=attention_op.bind_unified_attention
        )
