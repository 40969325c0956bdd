"""``ShardPlan``: how one rank of a tensor-parallel group holds a Llama / Qwen-family model (Megatron-style).

q/k/v and gate/up are split by output rows (column-parallel), o and down by input columns (row-parallel, one
all-reduce each), the embedding and the LM head by vocabulary rows (the embedding all-reduces, the head gathers).
Sparse experts are split whole (expert-parallel): rank ``r`` of ``N`` holds experts ``[r*E/N, (r+1)*E/N)``. How
tokens reach them is ``moe_a2a_backend`` (``MOE_A2A_BACKENDS``): ``none``, every rank routes every token and the
ranks' partial sums meet in one all-reduce, like a row-parallel projection's; ``all_to_all``, each rank sends its
share of the tokens to the ranks holding their experts and gets the results back (``moe_a2a``).
KV heads are split across ranks; when there are fewer KV heads than ranks, each KV head is replicated on the ranks
whose query heads use it. Everything here is arithmetic on the config: no torch, no process group.
"""

from __future__ import annotations

from dataclasses import dataclass

from .architecture import ModelConfig
from .errors import TensorParallelError

MOE_A2A_BACKENDS = ("none", "all_to_all")
"""How a sharded sparse block's tokens meet the experts (``--moe-a2a-backend``): ``none``, every rank computes its
experts for every token and one all-reduce sums the parts; ``all_to_all``, tokens are dispatched to the experts'
ranks and combined back (two all-to-alls and an all-gather)."""


@dataclass(frozen=True)
class RowRange:
    """Rows (or columns) ``[start, stop)`` of a checkpoint tensor along one dimension."""

    start: int
    stop: int

    @property
    def size(self) -> int:
        """How many rows the range holds."""
        return self.stop - self.start


@dataclass(frozen=True)
class ShardPlan:
    """Rank ``rank`` of a tensor-parallel group of ``size`` ranks; ``group_name`` names the process group the
    model's collectives run on (``None`` only when ``size == 1``); ``moe_a2a_backend`` is how sparse blocks reach
    their experts (one of ``MOE_A2A_BACKENDS``; ``all_to_all`` only with more than one rank).

    Example:
        >>> from cudagraph.engine.model import model_config_from_preset
        >>> config = model_config_from_preset("tiny-llama-random")  # 4 heads, 1 KV head
        >>> plan = ShardPlan(rank=1, size=2, group_name="tp")
        >>> plan.check(config)
        >>> plan.local_heads(config), plan.local_kv_heads(config), plan.kv_heads(config)
        (2, 1, RowRange(start=0, stop=1))
    """

    rank: int = 0
    size: int = 1
    group_name: str | None = None
    moe_a2a_backend: str = "none"

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise TensorParallelError(
                f"tensor-parallel rank {self.rank} of size {self.size}: the size must be at least 1 and the rank "
                f"between 0 and size - 1"
            )
        if self.size > 1 and not self.group_name:
            raise TensorParallelError(f"a tensor-parallel size of {self.size} needs the process group's name")
        if self.moe_a2a_backend not in MOE_A2A_BACKENDS:
            raise TensorParallelError(
                f"moe_a2a_backend {self.moe_a2a_backend!r} is not one of {', '.join(MOE_A2A_BACKENDS)}"
            )
        if self.dispatches_experts and self.size == 1:
            raise TensorParallelError(
                "moe_a2a_backend 'all_to_all' exchanges tokens between ranks and needs a tensor-parallel size of at "
                "least 2 (one rank holds every expert); use 'none' on one rank"
            )

    @property
    def dispatches_experts(self) -> bool:
        """Whether sparse blocks send tokens to the experts' ranks (``all_to_all``) instead of all-reducing."""
        return self.moe_a2a_backend == "all_to_all"

    @property
    def is_parallel(self) -> bool:
        """Whether the model is split over more than one rank (and so runs collectives)."""
        return self.size > 1

    def check(self, config: ModelConfig) -> None:
        """Raise ``TensorParallelError`` naming the first dimension of ``config`` that ``size`` cannot split."""
        tp = self.size
        if config.num_heads % tp:
            raise TensorParallelError(
                f"tensor-parallel size {tp} must divide num_attention_heads ({config.num_heads}): use one of "
                f"{', '.join(map(str, _divisors(config.num_heads)))}"
            )
        kv = config.num_kv_heads
        if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
            raise TensorParallelError(
                f"tensor-parallel size {tp} and num_key_value_heads ({kv}): one must divide the other (KV heads are "
                "split across ranks, or replicated when there are fewer KV heads than ranks)"
            )
        if config.intermediate_size % tp:
            raise TensorParallelError(
                f"tensor-parallel size {tp} must divide intermediate_size ({config.intermediate_size})"
            )
        if config.has_experts and config.num_experts % tp:
            raise TensorParallelError(
                f"tensor-parallel size {tp} must divide num_experts ({config.num_experts}): experts are split whole "
                f"across ranks; use one of {', '.join(map(str, _divisors(config.num_experts)))}"
            )
        if self.dispatches_experts and not config.has_experts:
            raise TensorParallelError(
                "moe_a2a_backend 'all_to_all' dispatches tokens to sparse experts, and this model has none (a dense "
                "MLP); use 'none'"
            )

    def local_heads(self, config: ModelConfig) -> int:
        """Query heads on this rank."""
        return config.num_heads // self.size

    def local_kv_heads(self, config: ModelConfig) -> int:
        """KV heads on this rank (one, replicated, when there are fewer KV heads than ranks)."""
        return max(config.num_kv_heads // self.size, 1)

    def kv_replicas(self, config: ModelConfig) -> int:
        """How many ranks hold each KV head (1 unless there are fewer KV heads than ranks)."""
        return max(self.size // config.num_kv_heads, 1)

    def q_heads(self, config: ModelConfig) -> RowRange:
        """The checkpoint's query heads this rank holds."""
        local = self.local_heads(config)
        return RowRange(self.rank * local, (self.rank + 1) * local)

    def kv_heads(self, config: ModelConfig) -> RowRange:
        """The checkpoint's KV heads this rank holds: those its query heads attend with."""
        local = self.local_kv_heads(config)
        first = self.rank // self.kv_replicas(config) * local
        return RowRange(first, first + local)

    def intermediate(self, config: ModelConfig) -> RowRange:
        """The MLP's intermediate channels on this rank."""
        local = config.intermediate_size // self.size
        return RowRange(self.rank * local, (self.rank + 1) * local)

    def experts(self, config: ModelConfig) -> RowRange:
        """The sparse experts this rank holds (all of them on one rank; none in a model without experts)."""
        local = config.num_experts // self.size
        return RowRange(self.rank * local, (self.rank + 1) * local)

    def vocab_per_rank(self, config: ModelConfig) -> int:
        """Rows of the embedding and head on every rank: the vocabulary split evenly, the last rank padded."""
        return -(-config.vocab_size // self.size)

    def vocab(self, config: ModelConfig) -> RowRange:
        """The vocabulary rows this rank holds (fewer than ``vocab_per_rank`` on a padded last rank)."""
        per_rank = self.vocab_per_rank(config)
        start = min(self.rank * per_rank, config.vocab_size)
        return RowRange(start, min(start + per_rank, config.vocab_size))

    def local_config(self, config: ModelConfig) -> ModelConfig:
        """``config`` with this rank's heads and MLP width: what one rank's decoder layers are built from."""
        if not self.is_parallel:
            return config
        self.check(config)
        return config.with_overrides(
            num_heads=self.local_heads(config),
            num_kv_heads=self.local_kv_heads(config),
            intermediate_size=config.intermediate_size // self.size,
        )


SINGLE_RANK = ShardPlan()
"""The whole model on one rank: no sharding, no collectives."""


def _divisors(value: int) -> list[int]:
    return [candidate for candidate in range(1, value + 1) if value % candidate == 0]
