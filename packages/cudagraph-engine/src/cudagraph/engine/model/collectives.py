"""Tensor-parallel collectives as registered operators, and the vocabulary-parallel embedding and head built on them.

``torch.ops.cudagraph_engine.all_reduce_(x, group_name)`` sums ``x`` over the group in place;
``torch.ops.cudagraph_engine.all_gather(x, group_name)`` stacks every rank's ``x`` into ``[world, *x.shape]``, and
``torch.ops.cudagraph_engine.all_gather_into_(out, x, group_name)`` does the same into ``out``, memory its caller
owns (the vocabulary-parallel head's ``VocabGatherBuffer``, which every captured graph shares);
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

import logging
from typing import Protocol

import torch
import torch.nn.functional as F

from cudagraph.backend_utils import register_split_op

from ..op_library import implement_op

logger = logging.getLogger(__name__)


class Communicator(Protocol):
    """The collectives of one process group, as the model's operators need them."""

    world_size: int

    def all_reduce_(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over every rank, in place."""
        ...

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` stacked in rank order: ``[world_size, *tensor.shape]``."""
        ...

    def all_gather_into(self, out: torch.Tensor, tensor: torch.Tensor) -> None:
        """Every rank's ``tensor`` written into ``out`` (contiguous, ``[world_size, *tensor.shape]``) in rank order."""
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
_LIBRARY.define("all_gather_into_(Tensor(a!) out, Tensor tensor, str group_name) -> ()")


def _all_reduce_(tensor: torch.Tensor, group_name: str) -> None:
    communicator_for(group_name).all_reduce_(tensor)


def _all_reduce_meta(tensor: torch.Tensor, group_name: str) -> None:
    return None


def _all_gather(tensor: torch.Tensor, group_name: str) -> torch.Tensor:
    return communicator_for(group_name).all_gather(tensor)


def _all_gather_meta(tensor: torch.Tensor, group_name: str) -> torch.Tensor:
    return tensor.new_empty((communicator_for(group_name).world_size, *tensor.shape))


def _all_gather_into_(out: torch.Tensor, tensor: torch.Tensor, group_name: str) -> None:
    communicator = communicator_for(group_name)
    expected = (communicator.world_size, *tensor.shape)
    if tuple(out.shape) != expected or not out.is_contiguous() or out.dtype != tensor.dtype:
        raise ValueError(
            f"all_gather_into_ over {group_name!r} writes a contiguous {tensor.dtype} tensor of shape {expected} (one "
            f"block per rank); got a {'' if out.is_contiguous() else 'non-contiguous '}{out.dtype} tensor of shape "
            f"{tuple(out.shape)}"
        )
    communicator.all_gather_into(out, tensor)


def _all_gather_into_meta(out: torch.Tensor, tensor: torch.Tensor, group_name: str) -> None:
    return None


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

all_gather_into_ = implement_op(_LIBRARY, "all_gather_into_", _all_gather_into_, _all_gather_into_meta)
"""The registered all-gather into a given tensor (an ``OpOverloadPacket``)."""

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


class VocabGatherBuffer:
    """Where a vocabulary-parallel head gathers every rank's logits: one tensor, allocated once outside any graph and
    shared by all of them, with room for ``rows`` rows of ``world_size`` x ``vocab_per_rank`` logits in the model
    dtype.

    A step of ``n`` rows gathers into the first ``n * world_size * vocab_per_rank`` elements (a contiguous
    ``[world_size, n, vocab_per_rank]`` view), so the graph of every bucket reads the same memory instead of keeping
    a gathered copy of its own in the graph pool; the gathered logits live only until the head has copied them into
    its float32 output, and steps (replays or eager) run one after another on a stream, so one buffer serves all of
    them. A step of more rows than reserved gathers into memory of its own, as without a buffer.

    ``reserve(rows)`` before capturing graphs of up to ``rows`` rows, outside the capture. Growing it allocates a new
    tensor and keeps the outgrown one (graphs captured earlier read it) until ``release_outgrown()``, which the
    owner calls once those graphs are gone.

    Example:
        >>> buffer = VocabGatherBuffer(world_size=2, vocab_per_rank=8, dtype=torch.float32, device="cpu")
        >>> buffer.reserve(4)
        >>> buffer.destination(3).shape, buffer.destination(3).data_ptr() == buffer.destination(1).data_ptr()
        (torch.Size([2, 3, 8]), True)
    """

    __slots__ = ("_flat", "_outgrown", "device", "dtype", "vocab_per_rank", "world_size")

    def __init__(self, world_size: int, vocab_per_rank: int, dtype: torch.dtype, device: torch.device | str) -> None:
        self.world_size = world_size
        self.vocab_per_rank = vocab_per_rank
        self.dtype = dtype
        self.device = torch.device(device)
        self._flat = torch.empty(0, dtype=dtype, device=self.device)
        self._outgrown: list[torch.Tensor] = []

    @property
    def row_elements(self) -> int:
        """Elements one row takes (every rank's slice of the vocabulary)."""
        return self.world_size * self.vocab_per_rank

    @property
    def rows(self) -> int:
        """The rows a step may have and still gather here (0 until ``reserve``)."""
        return self._flat.numel() // self.row_elements

    @property
    def nbytes(self) -> int:
        """Bytes the buffer holds now (outgrown ones included)."""
        held = (self._flat, *self._outgrown)
        return sum(tensor.numel() * tensor.element_size() for tensor in held)

    def data_ptr(self) -> int:
        """The address every step of up to ``rows`` rows gathers at."""
        return self._flat.data_ptr()

    def reserve(self, rows: int) -> None:
        """Make room for steps of up to ``rows`` rows (nothing to do when there is already); call it outside any
        capture, so the memory is not a graph's."""
        if rows <= self.rows:
            return
        grown = torch.empty(rows * self.row_elements, dtype=self.dtype, device=self.device)
        if self._flat.numel():
            # Graphs captured over the old buffer still read it: it stays until ``release_outgrown``.
            self._outgrown.append(self._flat)
            logger.info(
                "vocabulary-parallel head: logits gather buffer grown from %d to %d rows (the old one kept for the "
                "graphs captured over it)",
                self.rows,
                rows,
            )
        self._flat = grown

    def release_outgrown(self) -> None:
        """Drop the buffers ``reserve`` outgrew (once no graph captured over them is left)."""
        self._outgrown.clear()

    def destination(self, rows: int) -> torch.Tensor:
        """Where a step of ``rows`` rows gathers: ``[world_size, rows, vocab_per_rank]``, a view of this buffer's
        first rows, or new memory for a step larger than reserved."""
        shape = (self.world_size, rows, self.vocab_per_rank)
        if rows > self.rows:
            return torch.empty(shape, dtype=self.dtype, device=self.device)
        return self._flat[: rows * self.row_elements].view(shape)


def gather_vocab_logits(
    local_logits: torch.Tensor, group_name: str, vocab_size: int, buffer: VocabGatherBuffer | None = None
) -> torch.Tensor:
    """Full float32 logits ``[N, vocab_size]`` from every rank's ``[N, vocab_per_rank]`` slice (the last rank's
    padding columns cut off), gathered into ``buffer`` when there is one (else into memory of their own), then put in
    vocabulary order and converted to float32 by one copy."""
    rows, per_rank = local_logits.shape
    if buffer is None:
        gathered = all_gather(local_logits, group_name)  # [world, N, vocab_per_rank]
    else:
        gathered = buffer.destination(rows)
        all_gather_into_(gathered, local_logits, group_name)
    world = gathered.shape[0]
    logits = torch.empty((rows, world, per_rank), dtype=torch.float32, device=local_logits.device)
    logits.copy_(gathered.permute(1, 0, 2))
    return logits.view(rows, world * per_rank)[:, :vocab_size]
