"""Tensor-parallel collectives as registered operators, and the vocabulary-parallel embedding and head built on them.

``torch.ops.cudagraph_engine.all_reduce_(x, group_name)`` sums ``x`` over the group in place;
``torch.ops.cudagraph_engine.all_gather(x, group_name)`` stacks every rank's ``x`` into ``[world, *x.shape]``;
``torch.ops.cudagraph_engine.all_to_all(x, group_name)`` sends row block ``r`` of ``x`` ``[world, C, ...]`` to rank
``r`` and returns the blocks every rank sent this one, in rank order (the experts' token exchange). The
model passes the group by name and the operator resolves it to the ``Communicator`` registered under that name (the
engine's distributed layer registers one per process group, having chosen how small all-reduces travel). Being
operators, they are one opaque node to dynamo, and on CUDA they are plain stream work that a graph captures.

``all_to_all`` is also a registered split op: a breakable capture breaks at it (and runs it eagerly at every
replay) and ``tc_piecewise`` splits its compiled graph there, as at attention; a full graph captures it whole (its
splits are uniform, so nothing is read back to the host).

Only the tensor-parallel model calls these; a single-rank model runs none of it.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from cudagraph.backend_utils import register_split_op

from ..op_library import implement_op


class Communicator(Protocol):
    """The collectives of one process group, as the model's operators need them."""

    world_size: int

    def all_reduce_(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over every rank, in place."""
        ...

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` stacked in rank order: ``[world_size, *tensor.shape]``."""
        ...

    def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` ``[world_size, C, ...]``: block ``r`` goes to rank ``r``; returns the blocks received, block
        ``r`` from rank ``r``."""
        ...


_COMMUNICATORS: dict[str, Communicator] = {}


def register_communicator(group_name: str, communicator: Communicator) -> None:
    """Make ``communicator`` the one the operators use for ``group_name`` (replacing any earlier one)."""
    _COMMUNICATORS[group_name] = communicator


def unregister_communicator(group_name: str) -> None:
    """Forget ``group_name``'s communicator (at teardown); unknown names are ignored."""
    _COMMUNICATORS.pop(group_name, None)


def communicator_for(group_name: str) -> Communicator:
    """The communicator registered for ``group_name``; an unknown name is one error saying what to do."""
    communicator = _COMMUNICATORS.get(group_name)
    if communicator is None:
        known = ", ".join(sorted(_COMMUNICATORS)) or "none"
        raise RuntimeError(
            f"no communicator is registered for process group {group_name!r} (registered: {known}): start the "
            "tensor-parallel group (cudagraph.engine.distributed) before running a sharded model"
        )
    return communicator


_LIBRARY = torch.library.Library("cudagraph_engine", "FRAGMENT")
_LIBRARY.define("all_reduce_(Tensor(a!) tensor, str group_name) -> ()")
_LIBRARY.define("all_gather(Tensor tensor, str group_name) -> Tensor")
_LIBRARY.define("all_to_all(Tensor tensor, str group_name) -> Tensor")


def _all_reduce_(tensor: torch.Tensor, group_name: str) -> None:
    communicator_for(group_name).all_reduce_(tensor)


def _all_reduce_meta(tensor: torch.Tensor, group_name: str) -> None:
    return None


def _all_gather(tensor: torch.Tensor, group_name: str) -> torch.Tensor:
    return communicator_for(group_name).all_gather(tensor)


def _all_gather_meta(tensor: torch.Tensor, group_name: str) -> torch.Tensor:
    return tensor.new_empty((communicator_for(group_name).world_size, *tensor.shape))


def _all_to_all(tensor: torch.Tensor, group_name: str) -> torch.Tensor:
    communicator = communicator_for(group_name)
    if tensor.dim() == 0 or tensor.shape[0] != communicator.world_size:
        raise ValueError(
            f"all_to_all over {group_name!r} takes one row block per rank, [{communicator.world_size}, ...]; got "
            f"shape {tuple(tensor.shape)}"
        )
    return communicator.all_to_all(tensor)


def _all_to_all_meta(tensor: torch.Tensor, group_name: str) -> torch.Tensor:
    return torch.empty_like(tensor, memory_format=torch.contiguous_format)


all_reduce_ = implement_op(_LIBRARY, "all_reduce_", _all_reduce_, _all_reduce_meta)
"""The registered in-place all-reduce operator (an ``OpOverloadPacket``)."""

all_gather = implement_op(_LIBRARY, "all_gather", _all_gather, _all_gather_meta)
"""The registered all-gather operator (an ``OpOverloadPacket``)."""

all_to_all = implement_op(_LIBRARY, "all_to_all", _all_to_all, _all_to_all_meta)
"""The registered all-to-all operator (an ``OpOverloadPacket``), a split op."""

register_split_op(all_to_all)


def all_reduced(partial: torch.Tensor, group_name: str) -> torch.Tensor:
    """``partial`` summed over the group, in place (the output of a row-parallel projection), and returned."""
    all_reduce_(partial, group_name)
    return partial


def vocab_parallel_embedding(
    input_ids: torch.Tensor, weight: torch.Tensor, vocab_start: int, vocab_rows: int, group_name: str
) -> torch.Tensor:
    """Embeddings ``[T, hidden]`` of ``input_ids`` when each rank holds vocabulary rows ``[vocab_start,
    vocab_start + vocab_rows)`` in ``weight``: every rank looks up the ids it holds, zeros the rest, and one
    all-reduce puts each row together (no host sync: the mask is device work)."""
    local_ids = input_ids - vocab_start
    elsewhere = (local_ids < 0) | (local_ids >= vocab_rows)
    hidden = F.embedding(local_ids.masked_fill(elsewhere, 0), weight)
    hidden.masked_fill_(elsewhere.unsqueeze(-1), 0)
    return all_reduced(hidden, group_name)


def gather_vocab_logits(local_logits: torch.Tensor, group_name: str, vocab_size: int) -> torch.Tensor:
    """Full logits ``[N, vocab_size]`` from every rank's ``[N, vocab_per_rank]`` slice (the last rank's padding
    columns cut off)."""
    gathered = all_gather(local_logits, group_name)  # [world, N, vocab_per_rank]
    return gathered.permute(1, 0, 2).flatten(1)[:, :vocab_size]
