"""Test helpers for code built on the engine: record the aten ops a piece of code dispatches, run the attention
break unbound (as a replay that dispatches its op), make a synthetic decode batch over a model runner's KV cache
(and give its rows and slots back), and record where a tensor-parallel group's gathers write
(``GatherRecorder``). For tests and benchmarks, never for production."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cudagraph.backend_utils import is_capture_mode
from cudagraph.runner import ForwardBatch, ForwardMode

from .attention import op as attention_op
from .model.collectives import Communicator
from .model_runner import ModelRunner

__all__ = [
    "DispatchedOps",
    "GatherRecord",
    "GatherRecorder",
    "release_synthetic_batch",
    "synthetic_decode_batch",
    "unbound_attention",
]


@dataclass(frozen=True)
class GatherRecord:
    """One all-gather into a given tensor: the rows each rank sent, the address written and whether a graph was being
    captured (a CPU double's replay runs in capture mode too; a CUDA graph's replay calls no Python)."""

    rows: int
    address: int
    in_graph: bool


class GatherRecorder:
    """A group's communicator (``inner``) that records every all-gather into a given tensor (``gathers``) and passes
    every collective on. Register it under the group's name (``collectives.register_communicator``) to see where the
    vocabulary-parallel head gathers."""

    def __init__(self, inner: Communicator) -> None:
        self.inner = inner
        self.world_size = inner.world_size
        self.gathers: list[GatherRecord] = []

    def all_reduce_(self, tensor: torch.Tensor) -> None:
        """``inner``'s all-reduce."""
        self.inner.all_reduce_(tensor)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``inner``'s all-gather (not recorded: it writes into memory of its own)."""
        return self.inner.all_gather(tensor)

    def all_gather_into(self, out: torch.Tensor, tensor: torch.Tensor) -> None:
        """Record, then ``inner``'s all-gather into ``out``."""
        self.gathers.append(GatherRecord(int(tensor.shape[0]), out.data_ptr(), is_capture_mode()))
        self.inner.all_gather_into(out, tensor)

    def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        """``inner``'s all-to-all."""
        return self.inner.all_to_all(tensor)


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


def synthetic_decode_batch(model_runner: ModelRunner, batch_size: int, context_len: int, seed: int = 0) -> ForwardBatch:
    """``batch_size`` fresh requests of ``context_len`` cached tokens each (random ids, whatever KV is there),
    decoding their next token. Their rows and slots stay allocated; ``release_synthetic_batch`` gives them back."""
    device = model_runner.device
    generator = torch.Generator().manual_seed(seed)
    rows, slots = [], []
    for _ in range(batch_size):
        row = model_runner.req_to_token_pool.alloc()
        request_slots = model_runner.token_to_kv_pool.alloc(context_len + 1)
        model_runner.req_to_token_pool.write(row, 0, request_slots)
        rows.append(row)
        slots.append(request_slots[context_len])
    vocab = model_runner.model.config.vocab_size
    seq_lens_cpu = torch.full((batch_size,), context_len + 1, dtype=torch.int32)
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=batch_size,
        input_ids=torch.randint(0, vocab, (batch_size,), generator=generator).to(device),
        positions=torch.full((batch_size,), context_len, dtype=torch.int64, device=device),
        seq_lens=seq_lens_cpu.to(device),
        req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=device),
        out_cache_loc=torch.stack(slots).to(device),
        seq_lens_sum=int(seq_lens_cpu.sum()),
        seq_lens_cpu=seq_lens_cpu,
    )


def release_synthetic_batch(model_runner: ModelRunner, batch: ForwardBatch, context_len: int) -> None:
    """Give back the rows and slots ``synthetic_decode_batch`` took."""
    for row in batch.req_pool_indices.tolist():
        slots = model_runner.req_to_token_pool.req_to_token[row, : context_len + 1].to("cpu", torch.int64)
        model_runner.token_to_kv_pool.free(slots)
        model_runner.req_to_token_pool.free(row)
