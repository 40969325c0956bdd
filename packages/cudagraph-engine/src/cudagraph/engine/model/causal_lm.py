"""``CausalLM``: a Llama / Qwen2 / Qwen3 / Qwen3-MoE / Mixtral decoder over flat token batches, with attention
supplied by the caller.

The model owns no KV cache and no batch layout: ``forward`` takes the step's tokens and positions as flat ``[T]``
tensors and an ``attend`` callable that knows how tokens group into sequences. That keeps one model usable by the
paged engine, by CUDA-graph capture (static shapes, no host syncs) and by a dense single-sequence reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.layer_set import TORCH_KERNELS, LayerKernels
from .architecture import SUPPORTED_DTYPES, ModelConfig
from .collectives import VocabGatherBuffer, gather_vocab_logits, vocab_parallel_embedding
from .errors import ModelLoadError
from .layers import AttendFn, DecoderLayer, KernelModule, RMSNorm
from .moe_a2a import ExpertExchange
from .parallel import SINGLE_RANK, ShardPlan

_DTYPES_BY_NAME = {name: getattr(torch, name) for name in SUPPORTED_DTYPES}


def resolve_dtype(dtype: torch.dtype | str, config: ModelConfig) -> torch.dtype:
    """The compute dtype: ``"auto"`` is the checkpoint's (``config.torch_dtype``), else a supported name or dtype."""
    if dtype == "auto":
        return _DTYPES_BY_NAME[config.torch_dtype]
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES_BY_NAME.values():
        return dtype
    if isinstance(dtype, str) and dtype in _DTYPES_BY_NAME:
        return _DTYPES_BY_NAME[dtype]
    raise ModelLoadError(f"unsupported dtype {dtype!r}: use 'auto' or one of {', '.join(SUPPORTED_DTYPES)}")


class CausalLM(nn.Module):
    """A decoder-only language model of a supported family, with uninitialized weights until loaded.

    Build one with ``load_model`` (a Hugging Face directory) or ``random_model`` (random weights); constructing
    it directly allocates the parameters (``torch.empty``) on ``device`` in ``dtype``. Parameters never require
    grad. It computes through plain-torch kernels until ``use_kernels`` picks another set.

    With a ``shard`` of more than one rank the model holds rank ``shard.rank``'s part (``ShardPlan``): its layers
    are built from ``local_config`` (this rank's heads and MLP width), the embedding and head hold
    ``vocab_per_rank`` vocabulary rows, and ``forward``/``compute_logits`` run the collectives that make every
    rank's hidden states and logits those of the whole model.

    Example:
        >>> from cudagraph.engine.model import dense_attend, model_config_from_preset, random_model
        >>> model = random_model(model_config_from_preset("tiny-llama-random"))
        >>> ids = torch.tensor([1, 2, 3])
        >>> hidden = model(ids, torch.arange(3), dense_attend(model.config))
        >>> model.compute_logits(hidden[-1:]).shape
        torch.Size([1, 512])
    """

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype | str = "auto",
        device: torch.device | str = "cpu",
        shard: ShardPlan = SINGLE_RANK,
    ):
        super().__init__()
        self.config = config
        self.shard = shard
        self.local_config = shard.local_config(config)
        """``config`` with this rank's heads and MLP width (``config`` itself on one rank)."""
        self.dtype = resolve_dtype(dtype, config)
        self.device = torch.device(device)
        vocab = shard.vocab(config)
        self.vocab_start, self.vocab_rows = vocab.start, vocab.size
        # Zeros: a padded last rank's extra rows then give zero logits, which the gather cuts off anyway.
        self.embed_tokens = nn.Parameter(
            torch.zeros((shard.vocab_per_rank(config), config.hidden_size), dtype=self.dtype, device=self.device),
            requires_grad=False,
        )
        self.reduce_group = shard.group_name if shard.is_parallel else None
        """The process group the collectives run on, or ``None`` on one rank."""
        experts = shard.experts(config)
        exchange = (
            ExpertExchange(self.reduce_group, shard.rank, shard.size, experts.size)
            if shard.dispatches_experts and self.reduce_group is not None
            else None
        )
        self.layers = nn.ModuleList(
            DecoderLayer(self.local_config, layer_id, self.dtype, self.device, self.reduce_group, experts, exchange)
            for layer_id in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, self.dtype, self.device)
        self.lm_head = (
            self.embed_tokens
            if config.tie_word_embeddings
            else nn.Parameter(torch.zeros_like(self.embed_tokens), requires_grad=False)
        )
        self.logits_gather = (
            VocabGatherBuffer(shard.size, shard.vocab_per_rank(config), self.dtype, self.device)
            if self.reduce_group is not None
            else None
        )
        """Where a sharded head gathers its logits, shared by every graph (``reserve_logits_rows``); ``None`` on one
        rank."""
        self.kernels: LayerKernels = TORCH_KERNELS
        self.rotary_cos_sin: torch.Tensor
        self._build_rotary_table()

    def _build_rotary_table(self) -> None:
        table = self.kernels.rotary_table(self.config, self.dtype, self.device)
        self.register_buffer("rotary_cos_sin", table, persistent=False)

    def use_kernels(self, kernels: LayerKernels) -> None:
        """Compute through ``kernels`` from now on (every layer, and the rotary table in that set's layout)."""
        self.kernels = kernels
        for module in self.modules():
            if isinstance(module, KernelModule):
                module.kernels = kernels
        self._build_rotary_table()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: AttendFn) -> torch.Tensor:
        """Hidden states ``[T, hidden]`` after the final norm for the flat tokens ``input_ids`` ``[T]`` (int64) at
        ``positions`` ``[T]`` (int64, below ``max_position_embeddings``), attending through ``attend``."""
        if self.reduce_group is None:
            hidden = F.embedding(input_ids, self.embed_tokens)
        else:
            hidden = vocab_parallel_embedding(
                input_ids, self.embed_tokens, self.vocab_start, self.vocab_rows, self.reduce_group
            )
        rotary = self.kernels.rotary_step(self.rotary_cos_sin, positions)
        residual: torch.Tensor | None = None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, rotary, attend)
        assert residual is not None, "a model has at least one layer"
        return self.norm.add_and_norm(hidden, residual)[0]

    def reserve_logits_rows(self, rows: int) -> None:
        """Make the sharded head's gather buffer (``logits_gather``) hold ``rows`` rows: every step of up to that
        many rows, every graph's included, then gathers there instead of into memory of its own. Call it outside any
        capture (a model runner does, before capturing a phase's graphs). Nothing to do on one rank."""
        if self.logits_gather is not None:
            self.logits_gather.reserve(rows)

    def release_outgrown_logits(self) -> None:
        """Free the gather buffers ``reserve_logits_rows`` outgrew, once no graph captured over them is left."""
        if self.logits_gather is not None:
            self.logits_gather.release_outgrown()

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``[N, vocab]`` for hidden states ``[N, hidden]`` (the head runs in the model dtype; a
        sharded head's slices are gathered from every rank, into ``logits_gather`` when it has room)."""
        if self.reduce_group is None:
            return F.linear(hidden, self.lm_head).float()
        local = F.linear(hidden, self.lm_head)
        return gather_vocab_logits(local, self.reduce_group, self.config.vocab_size, self.logits_gather)
