"""What a runner needs from the host engine, as typed ``Protocol``s (structural: engines need not inherit them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from .forward_batch import ForwardBatch, ForwardMode
from .replay_metadata import ReplayMetadata


@runtime_checkable
class ReqToTokenPoolLike(Protocol):
    """The request-to-token table: row ``r`` lists the KV slots of request ``r`` in token order."""

    @property
    def req_to_token(self) -> torch.Tensor:
        """[rows, max_context_len] int32; row ``PADDING_REQ_POOL_INDEX`` is scratch."""
        ...


@runtime_checkable
class AttentionBackendLike(Protocol):
    """The attention hooks a runner calls around capture and replay.

    The capture and replay hooks run outside any graph, before the forward is captured or replayed, and must only
    update state in place (static buffers sized by ``init_cuda_graph_state``): a graph keeps the addresses it saw.

    Optional member ``needs_seq_lens_cpu`` (``HostLengthsHint``; without it, ``True``): ``False`` tells the decode
    runner the replay hook never reads ``ReplayMetadata.seq_lens_cpu``, so it skips keeping a padded host copy (one
    host copy less per step).
    """

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Prepare an eager step (may sync with the host)."""

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Allocate the static metadata buffers every captured shape will share."""

    def init_forward_metadata_capture_cuda_graph(
        self,
        batch_size: int,
        num_tokens: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        forward_mode: ForwardMode,
        **kwargs: Any,
    ) -> None:
        """Point the metadata at the static buffers of one shape about to be captured."""

    def init_forward_metadata_replay_cuda_graph(self, metadata: ReplayMetadata) -> None:
        """Refresh the static metadata of one captured shape (``metadata.batch_size`` rows) for the step about to be
        replayed.

        Preferred: this one-argument form. A backend whose hook still takes the legacy positional arguments
        ``(batch_size, req_pool_indices, seq_lens, seq_lens_sum, forward_mode, seq_lens_cpu=None, **kwargs)``, as
        SGLang-style backends do, keeps working: the runner reads the hook's signature once, when it is built, and
        calls it that way (``cudagraph.runner.replay_metadata.bind_replay_hook``).
        """

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        """The ``seq_len`` that makes a padded row harmless (it attends only to the scratch slot)."""
        ...


@runtime_checkable
class HostLengthsHint(Protocol):
    """An attention backend that says whether its replay hook reads the host copy of ``seq_lens``."""

    needs_seq_lens_cpu: bool
    """``False``: ``ReplayMetadata.seq_lens_cpu`` is never read, so the decode runner keeps no padded host copy."""


def needs_seq_lens_cpu(attn_backend: AttentionBackendLike) -> bool:
    """Whether ``attn_backend``'s replay hook reads ``ReplayMetadata.seq_lens_cpu`` (``True`` unless it says not)."""
    return attn_backend.needs_seq_lens_cpu if isinstance(attn_backend, HostLengthsHint) else True


@runtime_checkable
class ModelRunnerLike(Protocol):
    """The engine's model runner: a device, a dtype, a request-to-token pool, an attention backend and a forward."""

    @property
    def device(self) -> torch.device:
        """Where the model, the KV cache and every batch tensor live."""
        ...

    @property
    def dtype(self) -> torch.dtype:
        """The model's compute dtype."""
        ...

    @property
    def req_to_token_pool(self) -> ReqToTokenPoolLike:
        """The request-to-token table the attention backend reads."""
        ...

    @property
    def attn_backend(self) -> AttentionBackendLike:
        """The attention backend whose hooks the runners call."""
        ...

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits ``[B, vocab]``: one row per request (extend: each request's last token).

        Called eagerly by the engine and inside capture by the runners; inside capture it must not sync with the
        host or allocate shapes that depend on tensor values.
        """
        ...


@runtime_checkable
class TraceableModelRunner(Protocol):
    """A model runner that offers the traceable part of its forward: what a compiling backend (``tc_piecewise``, or
    ``full`` with compiled small buckets) traces. Optional: a runner whose backend compiles nothing never asks."""

    def model_forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Hidden states ``[T, H]`` of the flat tokens: no forward-context reads, no per-layer branches."""
        ...


@runtime_checkable
class GraphReadsModelRunner(Protocol):
    """A model runner that names the tensors its graphs read beyond the runner's static buffers (weights, buffers,
    the KV cache, the request table), so a runner can tell when they moved (``cudagraph.runner.graph_inputs``)."""

    def graph_read_tensors(self) -> Mapping[str, torch.Tensor]:
        """Every tensor a captured forward reads that the runner does not own, by a stable name."""
        ...


@runtime_checkable
class ModuleModelRunner(Protocol):
    """A model runner that holds its model as a ``torch.nn.Module`` (whose parameters and buffers the graphs read,
    when the model runner does not name them itself: ``GraphReadsModelRunner``)."""

    @property
    def model(self) -> torch.nn.Module:
        """The model the forward runs."""
        ...


def traceable_forward(model_runner: ModelRunnerLike) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """``model_runner.model_forward`` when it offers one (``TraceableModelRunner``), else ``None``."""
    return model_runner.model_forward if isinstance(model_runner, TraceableModelRunner) else None


@runtime_checkable
class DraftModelRunnerLike(ModelRunnerLike, Protocol):
    """A draft model's runner (an EAGLE-style head): its steps read the tokens and the hidden states handed to them
    (``ForwardBatch.hidden_states``) and return the next hidden states beside the logits, so the draft runners can
    chain its steps on the device (``cudagraph.runner.draft``, ``cudagraph.runner.draft_extend``).

    ``forward`` (of ``ModelRunnerLike``) is not called by the draft runners; ``attn_backend`` serves the draft
    extend step, and ``step_attn_backends[i]`` draft step ``i`` (each step attends over one more token than the one
    before, so each keeps its own metadata, as SGLang's multi-step draft backends do).
    """

    @property
    def hidden_size(self) -> int:
        """Width of the hidden states handed from step to step."""
        ...

    @property
    def step_attn_backends(self) -> Sequence[AttentionBackendLike]:
        """One attention backend per draft step (at least as many as the draft runner's ``num_steps``), over the
        draft model's KV cache."""
        ...

    def draft_forward(
        self, batch: ForwardBatch, attn_backend: AttentionBackendLike
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[T, vocab]`` and hidden states ``[T, H]`` of every token of ``batch`` (decode: one per request;
        verify-shaped: ``query_len`` per request), reading ``batch.hidden_states`` and attending through
        ``attn_backend`` (its metadata prepared as ``forward`` prepares its own). Called eagerly and inside capture:
        no host syncs there."""
        ...


@runtime_checkable
class TraceableDraftModelRunner(Protocol):
    """A draft model runner that offers the traceable part of its step (what ``tc_piecewise`` compiles)."""

    def draft_model_forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor
    ) -> torch.Tensor:
        """The head's hidden states ``[T, H]`` of the flat tokens and the hidden states handed to them."""
        ...
