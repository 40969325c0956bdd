"""The reference model runner: owns the model, the KV cache, the attention backend, the model's kernel set and the
two graph runners.

``run(batch)`` is the one entry the engine calls per step: the graph runner of the batch's kind routes it once and
replays it or runs it eagerly; without a runner the eager ``forward`` takes it. Uniform steps (every request the same
number of tokens) go to the decode phase's runners: decode to ``decode_cuda_graph_runner``, a speculative verify step
to ``verify_cuda_graph_runner`` (both ``full`` graphs by default); every other step (prefill, chunked prefill, a
prefill mixed with decodes) to the prefill phase's runner (``breakable`` or ``tc_piecewise``). Either way the step
is counted in ``cuda_graph_metrics`` (verify steps in ``verify_cuda_graph_metrics``). ``forward`` is also what the
graph runners capture, so it must stay free of host syncs and value-dependent shapes whenever ``is_capture_mode()``
is on.

With a ``lora_config`` the engine serves LoRA adapters (``cudagraph.engine.lora``) and keeps two graph variants per
phase: the plain runners above, and ``lora_decode_cuda_graph_runner`` / ``lora_prefill_cuda_graph_runner``, captured
with the adapters applied at ``max_rank`` (their steps counted in ``lora_cuda_graph_metrics``). A variant is keyed by
what changes the captured work, never by adapter: a step whose requests use any adapter replays the LoRA variant,
the adapters' per-token slot indices written into a persistent buffer when its batch is built; any other step
replays the plain one. ``cuda_graph_variant_replays`` says how often each variant replayed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch

from cudagraph.backend_utils import ForwardContext, compiled_model_forward, set_forward_context
from cudagraph.backend_utils.sleep_memory import MemoryTag, SleepMemory
from cudagraph.config import Backend, ConfigError, CudaGraphConfig, Phase
from cudagraph.runner import (
    DecodeCudaGraphRunner,
    EagerReason,
    ForwardBatch,
    ForwardMode,
    ModelRunnerLike,
    PrefillCudaGraphRunner,
    ReplayMetrics,
    RunnerConfig,
    StepInputs,
)

from . import lifecycle
from .attention import make_attention_backend
from .attention.op import attend
from .batch import Request, extend_lens, make_decode_batch, make_extend_batch, make_verify_batch
from .kernels import KernelTarget, LayerKernels, select_kernels
from .kv_cache import ReqToTokenPool, TokenToKVPool, check_page_size, pages_for
from .lora import LoraAdapter, LoraConfig, LoraError, LoraManager
from .lora.host import LoraForwardHost

logger = logging.getLogger(__name__)

RunnerT = TypeVar("RunnerT", DecodeCudaGraphRunner, PrefillCudaGraphRunner)


class CausalLMLike(Protocol):
    """What the runner needs from a model: ``forward(input_ids, positions, attend) -> hidden`` and the head."""

    config: Any
    local_config: Any
    """The config of this rank's part of the model (heads, MLP width): what the KV cache is sized from."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: Any) -> torch.Tensor:
        """Hidden states ``[T, H]`` after the final norm."""
        ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, vocab]`` of ``hidden`` ``[N, H]``."""
        ...

    def parameters(self) -> Any:
        """The model's parameters (their device and dtype are the runner's)."""
        ...

    def use_kernels(self, kernels: LayerKernels) -> None:
        """Compute through ``kernels`` from now on."""
        ...


@runtime_checkable
class SharesLogitsGather(Protocol):
    """A model whose head gathers its logits into a buffer every graph shares (a vocabulary-parallel head,
    ``CausalLM`` on a tensor-parallel rank): the model runner sizes it before capturing a phase's graphs."""

    def reserve_logits_rows(self, rows: int) -> None:
        """Make room for steps of up to ``rows`` logits rows, outside any capture."""
        ...

    def release_outgrown_logits(self) -> None:
        """Free what earlier, smaller reservations held (once their graphs are gone)."""
        ...


def logits_rows(runner: DecodeCudaGraphRunner | PrefillCudaGraphRunner) -> int:
    """The most logits rows a graph of ``runner`` returns: a row per request of its largest bucket in decode, a row
    per token in verify, a row per request in prefill."""
    if isinstance(runner, PrefillCudaGraphRunner):
        return runner.max_requests
    return runner.max_size * runner.query_len


@dataclass(frozen=True)
class CacheConfig:
    """How big the KV cache is: request rows, tokens per request, KV slots in total, and tokens per page."""

    max_num_reqs: int = 64
    max_context_len: int = 1024
    num_kv_slots: int | None = None
    """Defaults to every request at full length in whole pages (``max_num_reqs * pages(max_context_len)``)."""
    page_size: int = 1
    """Tokens per KV page: a power of two up to ``MAX_PAGE_SIZE``; requests are allocated whole pages."""

    def __post_init__(self) -> None:
        check_page_size(self.page_size)

    def resolved_slots(self) -> int:
        """The number of KV slots to allocate (rounded up to whole pages)."""
        if self.num_kv_slots is not None:
            return pages_for(self.num_kv_slots, self.page_size) * self.page_size
        return self.max_num_reqs * pages_for(self.max_context_len, self.page_size) * self.page_size


@dataclass(frozen=True)
class ModelShape:
    """The attention dimensions the KV cache and the attention backend are sized from."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    attention_scale: float

    @classmethod
    def of(cls, model_config: Any) -> ModelShape:
        """Read the dimensions from a ``cudagraph.engine.model.ModelConfig``."""
        return cls(
            num_layers=model_config.num_layers,
            num_heads=model_config.num_heads,
            num_kv_heads=model_config.num_kv_heads,
            head_dim=model_config.head_dim,
            attention_scale=model_config.attention_scale,
        )


GRAPHS_NEED_CUDA = "CUDA graphs need a CUDA device; the model runs on {device}, so every {phase} step runs eagerly"


def check_graphs_fit_attention(config: CudaGraphConfig, attention: object, attention_name: str) -> None:
    """Raise ``ConfigError`` when ``config``'s graphs need what the attention backend ``attention`` (an instance or
    its class, called ``attention_name``) cannot do. Prefill ``full`` captures extend attention inside the graph:
    only a backend that can (``captures_extend_attention``) runs it; any other is one clear error before anything is
    captured."""
    if config.backend(Phase.PREFILL) is not Backend.FULL:
        return
    if getattr(attention, "captures_extend_attention", False):
        return
    raise ConfigError(
        f"prefill CUDA-graph backend 'full' captures attention inside the graph, which the {attention_name!r} "
        "attention backend cannot yet (torch's extend attention loops over the requests on the host; FlashInfer's "
        "graph prefill wrappers are not proven); use the 'triton' attention backend (--attention-backend triton), "
        "or prefill 'breakable' or 'tc_piecewise' (--prefill-cuda-graph-backend breakable)"
    )


def check_verify_fits_attention(attention: object, attention_name: str) -> None:
    """Raise ``ConfigError`` when the attention backend ``attention`` (an instance or its class, called
    ``attention_name``) cannot run speculative verify steps (``supports_verify``)."""
    if getattr(attention, "supports_verify", False):
        return
    raise ConfigError(
        f"speculative decoding runs verify steps (several tokens per request, logits of each), which the "
        f"{attention_name!r} attention backend cannot yet; use the 'triton' or 'torch' attention "
        "backend (--attention-backend triton)"
    )


class ModelRunner:
    """Runs forward steps of one model over a paged KV cache, replaying CUDA graphs where they apply.

    The graph runners are created by ``init_decode_cuda_graph()`` and ``init_prefill_cuda_graph()`` (or both by
    ``init_cuda_graphs()``); until then, and for batches they cannot take, steps run eagerly.

    ``kernel_backend`` picks the model's kernel set (``kernels.registry``: ``auto``, ``torch``, ``triton``,
    ``flashinfer``) and sets it on the model; a forward a graph backend compiles (``tc_piecewise``) gets one dynamo
    can trace (``torch``, or ``triton`` through its custom ops).
    ``attention_backend`` is ``torch``, ``triton``, ``flashinfer`` or ``auto`` (the fastest that runs here,
    ``attention.choice``; the CLI's default); ``attention_backend_name`` says which one is in use.

    On a tensor-parallel rank the model is that rank's shard: the KV cache and attention hold its heads
    (``model.local_config``), and ``capture_barrier`` (a host-side barrier of the group) is where the ranks meet
    before each eager break of a breakable capture, so every rank captures the same shapes in lock-step.

    ``log_capture_estimate`` logs each phase's ``estimate_capture_memory()`` before its capture (the CLI's
    ``--estimate-cuda-graph-memory``). It is off by default: the estimate captures a few probe graphs of its own,
    which a plain start need not pay for. A phase with a memory budget estimates anyway (its capture is planned
    from the estimate) and its capture's log line compares the estimate with the bytes taken.

    ``keep_hidden_states`` (``q``, 0: off) keeps every token's last hidden state of each forward in
    ``hidden_states_buffer`` (sized for prefill steps and decode-phase steps of up to ``q`` tokens a request: a
    verify step's ``k + 1``), written inside the forward and so inside every graph: what an EAGLE drafter
    (``cudagraph.engine.eagle``) reads on the device after the target's prefill and verify steps.
    """

    def __init__(
        self,
        model: CausalLMLike,
        cuda_graph_config: CudaGraphConfig,
        *,
        cache_config: CacheConfig | None = None,
        attention_backend: str = "torch",
        kernel_backend: str = "auto",
        show_progress: bool = False,
        capture_barrier: Callable[[], None] | None = None,
        log_capture_estimate: bool = False,
        lora_config: LoraConfig | None = None,
        enable_sleep_mode: bool = False,
        keep_hidden_states: int = 0,
    ) -> None:
        first_parameter = next(iter(model.parameters()))
        self.model = model
        self.device: torch.device = first_parameter.device
        self.dtype: torch.dtype = first_parameter.dtype
        self.sleep_memory: SleepMemory | None = None
        """Where the weights, the KV cache and the graphs live when ``enable_sleep_mode`` found sleepable memory
        (``cudagraph.backend_utils.sleep_memory``): a sleep unmaps them, a wake maps them back at the same addresses
        and replays with nothing captured again. ``None``: a sleep frees them and a wake captures again."""
        self.sleep_memory_reason: str | None = None
        """With ``enable_sleep_mode``, why there is no sleepable memory here (one line; the wake then recaptures)."""
        if enable_sleep_mode:
            self.sleep_memory, self.sleep_memory_reason = lifecycle.open_sleep_memory(self.device)
        self.weights_buffer: torch.Tensor | None = lifecycle.flatten_weights(self.sleep_memory, model)
        """With sleepable memory, the one flat buffer every parameter is a view of (a level-1 sleep copies it out
        and back whole); else ``None``."""
        self.cuda_graph_config = cuda_graph_config
        self.cache_config = cache_config or CacheConfig()
        self.show_progress = show_progress
        self.capture_barrier = capture_barrier
        self.log_capture_estimate = log_capture_estimate
        """Log each phase's graph memory estimate before capturing it (probe captures on every start)."""
        self.shape = ModelShape.of(model.local_config)
        page_size = self.cache_config.page_size
        self.req_to_token_pool = ReqToTokenPool(
            self.cache_config.max_num_reqs, self.cache_config.max_context_len, self.device, page_size=page_size
        )
        with lifecycle.allocating(self.sleep_memory, MemoryTag.KV_CACHE):
            self.token_to_kv_pool = TokenToKVPool(
                self.cache_config.resolved_slots(),
                self.shape.num_layers,
                self.shape.num_kv_heads,
                self.shape.head_dim,
                self.dtype,
                self.device,
                page_size=page_size,
            )
        self.attn_backend = make_attention_backend(
            attention_backend, self.req_to_token_pool, self.token_to_kv_pool, self.shape
        )
        self.attention_backend_name: str = getattr(self.attn_backend, "name", attention_backend)
        """The attention backend in use (the one ``auto`` took, when asked for ``auto``)."""
        self.kernel_backend_name = kernel_backend
        self.check_graph_config(cuda_graph_config)
        self.kernels: LayerKernels = self.kernels_for(cuda_graph_config)
        model.use_kernels(self.kernels)
        self.decode_cuda_graph_runner: DecodeCudaGraphRunner | None = None
        self.verify_cuda_graph_runner: DecodeCudaGraphRunner | None = None
        """Graphs of speculative verify steps (``init_verify_cuda_graph``): the decode phase's backend and buckets,
        ``query_len`` tokens per request."""
        self.prefill_cuda_graph_runner: PrefillCudaGraphRunner | None = None
        self.cuda_graph_metrics: dict[Phase, ReplayMetrics] = {phase: ReplayMetrics(phase) for phase in Phase}
        """Every step ``run`` took, per phase, for this engine's life: its graph runners count into these, and
        steps of a phase without a runner are counted here under why it has none."""
        self.verify_cuda_graph_metrics = ReplayMetrics(Phase.DECODE, label="verify")
        """Every verify step ``run`` took (speculative decoding): kept apart from decode's, whose buckets count
        one-token steps."""
        self.weights_version = 0
        """Bumped by every ``update_weights``."""
        self.asleep = False
        """Between ``sleep()`` and ``wake()``: graphs and KV cache given back, steps refused."""
        self.memory_levels = lifecycle.MemoryLevels()
        """Free device memory before ``sleep``, asleep and after ``wake`` (the latest cycle; CUDA only)."""
        self.sleep_level = 0
        """The level of the latest ``sleep`` (``lifecycle.SLEEP_LEVELS``)."""
        self.weights_on_host: list[torch.Tensor] = []
        """The parameters' pinned host copies a level-1 sleep made (kept, and reused by the next level-1 sleep)."""
        self.lora: LoraManager | None = None
        """The LoRA adapters' slots and step indices (``lora_config``), or ``None``: no adapters."""
        self.lora_decode_cuda_graph_runner: DecodeCudaGraphRunner | None = None
        """Decode graphs with the adapters applied: what a decode step whose requests use any adapter replays."""
        self.lora_prefill_cuda_graph_runner: PrefillCudaGraphRunner | None = None
        """Prefill graphs with the adapters applied."""
        self.lora_cuda_graph_metrics: dict[Phase, ReplayMetrics] = {
            phase: ReplayMetrics(phase, label=f"{phase} lora") for phase in Phase
        }
        """Every step ``run`` took with adapters, per phase (speculative verify steps with adapters run eagerly and
        count here under decode)."""
        self._lora_batch: ForwardBatch | None = None
        """The latest batch built with adapters (``run`` takes the LoRA variant for it alone)."""
        if lora_config is not None:
            self.lora = LoraManager(lora_config, model, self._max_step_tokens())
        self.hidden_states_buffer: torch.Tensor | None = None
        """With ``keep_hidden_states``: every forward writes each token's last hidden state (after the final norm) to
        its first rows, in the step's token order, inside the forward (so inside every captured graph, whatever the
        backend): what an EAGLE drafter reads after a prefill or verify step, on the device. ``None``: not kept."""
        if keep_hidden_states:
            rows = max(
                self._max_step_tokens(), self.cuda_graph_config.for_phase(Phase.DECODE).max_size * keep_hidden_states
            )
            self.hidden_states_buffer = torch.zeros(
                (rows, model.config.hidden_size), dtype=self.dtype, device=self.device
            )

    def _max_step_tokens(self) -> int:
        """The most tokens a forward can bring: each new token takes a KV slot, and a graph bucket may pad past the
        step's tokens (what the LoRA index and scale buffers are sized for)."""
        graph_tokens = (self.cuda_graph_config.for_phase(phase).max_size for phase in Phase)
        return max(self.cache_config.resolved_slots(), *graph_tokens)

    def kernels_for(self, config: CudaGraphConfig) -> LayerKernels:
        """The kernel set this engine's ``kernel_backend`` picks when its graphs follow ``config``: with ``auto``,
        never FlashInfer's where a graph compiles the forward (``config.model_forward_compiler``: dynamo cannot trace
        its functions); the Triton set's operations trace as custom ops, so it is picked there too."""
        return self._select_kernels(traced=config.model_forward_compiler is not None)

    def traced_kernels(self) -> LayerKernels:
        """The kernel set this engine's ``kernel_backend`` picks for a forward that dynamo traces."""
        return self._select_kernels(traced=True)

    def _select_kernels(self, traced: bool) -> LayerKernels:
        # The kernels run at this rank's sizes (its heads and MLP width), the whole model's on one rank.
        target = KernelTarget(self.model.local_config, self.dtype, self.device, traced=traced)
        return select_kernels(self.kernel_backend_name, target)

    def use_kernels(self, kernels: LayerKernels) -> None:
        """Compute through ``kernels`` from now on (a runner built outside this engine's config, as a benchmark
        does, switches to ``kernels_for(its config)`` and back)."""
        self.kernels = kernels
        self.model.use_kernels(kernels)

    def check_graph_config(self, config: CudaGraphConfig) -> None:
        """Raise ``ConfigError`` when this engine cannot run ``config``'s graphs (``check_graphs_fit_attention``)."""
        check_graphs_fit_attention(config, self.attn_backend, self.attention_backend_name)

    # -- requests ---------------------------------------------------------------------------------------------------

    def hold(self, request: Request) -> Request:
        """Give ``request`` its place in the KV cache, what admitting it takes: a request row and KV slots for its
        whole budget (``Request.budget``), the row pointing at them. Returns it. ``CacheFullError`` when the cache
        has no room, with nothing taken; ``LoraError`` when it names an adapter that is not loaded."""
        self._check_adapter(request)
        row = self.req_to_token_pool.alloc()
        try:
            slots = self.token_to_kv_pool.alloc(request.budget)
        except BaseException:
            self.req_to_token_pool.free(row)
            raise
        request.req_pool_index, request.kv_slots = row, slots
        self.req_to_token_pool.write(row, 0, slots)
        return request

    def release(self, request: Request) -> None:
        """Give back ``request``'s row and KV slots (``hold`` undone)."""
        assert request.kv_slots is not None, "release of a request that holds no KV slots"
        self.token_to_kv_pool.free(request.kv_slots)
        self.req_to_token_pool.free(request.req_pool_index)
        request.kv_slots, request.req_pool_index = None, -1

    # -- graphs -----------------------------------------------------------------------------------------------------

    def graphs_unavailable_reason(self, phase: Phase) -> str | None:
        """Why this engine cannot graph ``phase`` although its config may (no CUDA device), or ``None``. Whether the
        phase is graphed at all is the config's to say (``PhaseConfig.enabled``), and it said why not where it
        resolved."""
        if self.device.type != "cuda":
            return GRAPHS_NEED_CUDA.format(device=self.device, phase=phase)
        return None

    def init_decode_cuda_graph(self) -> DecodeCudaGraphRunner | None:
        """Create and capture the decode runner (``None``, with the reason logged, when decode runs eagerly), and with
        LoRA its LoRA variant after it (into the same graph pool: both follow the phase's backend, which shares the
        process-wide pool by default)."""
        self.decode_cuda_graph_runner = self._init_runner(Phase.DECODE, DecodeCudaGraphRunner)
        if self.lora is not None:
            self.lora_decode_cuda_graph_runner = self._init_runner(
                Phase.DECODE, DecodeCudaGraphRunner, metrics=self.lora_cuda_graph_metrics[Phase.DECODE], lora=True
            )
        return self.decode_cuda_graph_runner

    def init_verify_cuda_graph(self, query_len: int) -> DecodeCudaGraphRunner | None:
        """Create and capture the runner of speculative verify steps of ``query_len`` tokens per request (the last
        token and ``query_len - 1`` drafts): the decode phase's backend and buckets (a bucket counts requests).
        ``None``, with the reason logged, when decode runs eagerly. Needs an attention backend that runs verify steps
        (``supports_verify``): otherwise one ``ConfigError`` before anything is captured."""
        self.check_verify_support()
        self.verify_cuda_graph_runner = self._init_runner(
            Phase.DECODE, DecodeCudaGraphRunner, query_len=query_len, metrics=self.verify_cuda_graph_metrics
        )
        return self.verify_cuda_graph_runner

    def check_verify_support(self) -> None:
        """Raise ``ConfigError`` when this engine's attention backend cannot run speculative verify steps
        (``check_verify_fits_attention``)."""
        check_verify_fits_attention(self.attn_backend, self.attention_backend_name)

    def init_prefill_cuda_graph(self) -> PrefillCudaGraphRunner | None:
        """Create and capture the prefill runner (``None``, with the reason logged, when prefill runs eagerly)."""
        self.prefill_cuda_graph_runner = self._init_runner(Phase.PREFILL, PrefillCudaGraphRunner)
        if self.lora is not None:
            self.lora_prefill_cuda_graph_runner = self._init_runner(
                Phase.PREFILL, PrefillCudaGraphRunner, metrics=self.lora_cuda_graph_metrics[Phase.PREFILL], lora=True
            )
        return self.prefill_cuda_graph_runner

    def capture_cuda_graph_variant(
        self, phase: Phase, *, lora: bool, backend: Any = None
    ) -> DecodeCudaGraphRunner | PrefillCudaGraphRunner:
        """Create, capture and install ``phase``'s runner of one variant (``lora``: the adapters applied) on
        ``backend`` (a graph backend the runners take; default: the phase's configured one), whatever the device:
        what a benchmark measuring one variant, or a test on the CPU double
        (``cudagraph.backend.testing.CpuReplayBackend``), builds. A runner the variant had is shut down first."""
        attribute = f"{'lora_' if lora else ''}{phase}_cuda_graph_runner"
        old = getattr(self, attribute)
        if old is not None:
            old.shutdown()
        metrics = (self.lora_cuda_graph_metrics if lora else self.cuda_graph_metrics)[phase]
        runner: DecodeCudaGraphRunner | PrefillCudaGraphRunner
        if phase is Phase.DECODE:
            runner = self._make_runner(phase, DecodeCudaGraphRunner, metrics=metrics, lora=lora, backend=backend)
        else:
            runner = self._make_runner(phase, PrefillCudaGraphRunner, metrics=metrics, lora=lora, backend=backend)
        setattr(self, attribute, runner)
        return runner

    def _init_runner(
        self,
        phase: Phase,
        runner_type: type[RunnerT],
        *,
        metrics: ReplayMetrics | None = None,
        lora: bool = False,
        **runner_options: Any,
    ) -> RunnerT | None:
        reason = self.runnerless_reason(phase)
        if reason is EagerReason.NOT_CAPTURED:
            return self._make_runner(phase, runner_type, metrics=metrics, lora=lora, **runner_options)
        if reason is EagerReason.GRAPHS_UNAVAILABLE and self.cuda_graph_config.for_phase(phase).enabled:
            logger.warning(self.graphs_unavailable_reason(phase))  # graphs the config asked for, this device lacks
        return None  # a disabled phase: the config's decision, explained where it resolved

    def _make_runner(
        self,
        phase: Phase,
        runner_type: type[RunnerT],
        *,
        metrics: ReplayMetrics | None,
        lora: bool,
        **runner_options: Any,
    ) -> RunnerT:
        """A captured runner of ``phase``; ``lora``: its forwards apply the adapters (``LoraForwardHost``)."""
        if lora and self.lora is None:
            raise ConfigError("a LoRA graph variant needs LoRA: build the ModelRunner with a lora_config")
        host: ModelRunnerLike = LoraForwardHost(self) if lora else self
        runner = runner_type(
            host,
            RunnerConfig.of(self.cuda_graph_config, phase),
            show_progress=self.show_progress,
            capture_barrier=self.capture_barrier,
            metrics=metrics if metrics is not None else self.cuda_graph_metrics[phase],
            **runner_options,
        )
        if isinstance(self.model, SharesLogitsGather):
            # Before the capture, so the buffer is nobody's graph memory and every bucket's graph shares it.
            self.model.reserve_logits_rows(logits_rows(runner))
        self._capture_or_free(runner)
        return runner

    def _capture_or_free(self, runner: DecodeCudaGraphRunner | PrefillCudaGraphRunner) -> None:
        try:
            if self.log_capture_estimate:
                # Only when asked: its probe captures lengthen every start, and nothing here needs it otherwise (the
                # KV cache is sized by CacheConfig, not from free memory; a phase with a budget has its capture make
                # it). The capture reuses it, and its log line checks it against the bytes taken.
                logger.info("%s CUDA graphs will take %s", runner.phase, runner.estimate_capture_memory())
            runner.capture()
        except BaseException:
            runner.shutdown()  # nothing half-captured stays behind (graphs, buffers, the pool reference)
            raise

    def init_cuda_graphs(self) -> None:
        """Both phases: decode first, so prefill's smaller graphs reuse nothing decode needs later."""
        self.init_decode_cuda_graph()
        self.init_prefill_cuda_graph()

    def shutdown(self) -> None:
        """Free every graph runner (the model and the KV cache stay)."""
        for runner in lifecycle.graph_runners(self):
            runner.shutdown()
        self.decode_cuda_graph_runner = self.verify_cuda_graph_runner = self.prefill_cuda_graph_runner = None
        self.lora_decode_cuda_graph_runner = self.lora_prefill_cuda_graph_runner = None
        if isinstance(self.model, SharesLogitsGather):
            self.model.release_outgrown_logits()
        lifecycle.close_sleep_memory(self.sleep_memory)

    # -- LoRA adapters (``cudagraph.engine.lora``) ------------------------------------------------------------------

    def load_lora_adapter(self, name: str, source: LoraAdapter | str | Path) -> int:
        """Load adapter ``name`` from ``source`` (a ``LoraAdapter`` or a PEFT directory) into a slot, in place: the
        captured graphs stay valid, and the next step of a request using ``name`` replays with it. Returns the
        slot (``name``'s own when it was loaded before: replaced)."""
        return self._lora_manager().load(name, source)

    def unload_lora_adapter(self, name: str) -> None:
        """Zero ``name``'s slot and free it (in place, like loading)."""
        self._lora_manager().unload(name)

    def _lora_manager(self) -> LoraManager:
        if self.lora is None:
            raise LoraError("this ModelRunner serves no LoRA adapters: build it with a lora_config")
        return self.lora

    def _check_adapter(self, request: Request) -> None:
        name = request.params.lora_name
        if name is not None:
            self._lora_manager().index_of(name)

    def _write_lora_step(self, requests: Sequence[Request], tokens: Sequence[int]) -> bool:
        """Write the step's per-token adapter indices (when any request uses an adapter); whether it uses one."""
        names = [request.params.lora_name for request in requests]
        if self.lora is None or all(name is None for name in names):
            return False
        return self.lora.write_step(names, tokens)

    def lora_forward(self, batch: ForwardBatch) -> torch.Tensor:
        """``forward`` with the adapters applied, per token through the slot indices of the step's batch (what the
        LoRA variant's runners capture and run)."""
        step = self._lora_manager().step
        with step.applying():
            step.gather_scales(batch.input_ids.shape[0])  # once a forward, captured with it; the layers read it
            return self.forward(batch)

    @property
    def step_metrics(self) -> tuple[ReplayMetrics, ...]:
        """Every ``ReplayMetrics`` a step can be counted in: each phase's plain graphs', each phase's LoRA variant's,
        then the verify steps'."""
        return (
            *self.cuda_graph_metrics.values(),
            *self.lora_cuda_graph_metrics.values(),
            self.verify_cuda_graph_metrics,
        )

    @property
    def cuda_graph_variant_replays(self) -> dict[str, int]:
        """Graph replays per variant for this engine's life, by metrics label: ``decode`` and ``prefill`` (the plain
        graphs), ``decode lora`` and ``prefill lora`` (the LoRA variant's), ``verify``."""
        return {metrics.label: metrics.replays for metrics in self.step_metrics}

    # -- across the engine's life (``cudagraph.engine.lifecycle``) ---------------------------------------------------

    def graph_read_tensors(self) -> dict[str, torch.Tensor]:
        """What the graphs read beyond the runners' static buffers (weights, buffers, KV cache, request table): the
        runners record their addresses at capture."""
        return lifecycle.graph_read_tensors(self)

    def update_weights(
        self, weights: Mapping[str, torch.Tensor], *, in_place: bool = True, on_moved: str = "recapture"
    ) -> lifecycle.WeightUpdate:
        """Write ``weights`` (name -> value) into the model: in place (graphs stay valid, nothing recaptured), or
        with new memory (``in_place=False``: graphs that read it are captured again, or refused with
        ``on_moved="raise"``). Never lets a step replay old weights."""
        return lifecycle.update_weights(self, weights, in_place=in_place, on_moved=on_moved)

    def sleep(self, level: int = 0) -> lifecycle.MemoryLevels:
        """Give back the graphs' and the KV cache's memory, and at ``level`` 1 or 2 the weights' (1: copied to host
        memory and back at wake; 2: discarded, the caller loads new ones after the wake, as RL drivers do). Steps are
        refused until ``wake()``; requests in flight lose their cache. With sleepable memory (``enable_sleep_mode``)
        the graphs are kept and replay after the wake; without, they are freed and captured again."""
        return lifecycle.sleep(self, level)

    def wake(self) -> lifecycle.MemoryLevels:
        """Map the memory back (or re-allocate it), the KV cache empty and the weights as ``sleep``'s level left them,
        and replay the kept graphs, or capture them again (all, or on first use under the lazy policy); a runner that
        cannot runs eagerly and says why."""
        return lifecycle.wake(self)

    # -- steps ------------------------------------------------------------------------------------------------------

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits of ``batch``: the graph runner of its kind routes it once and replays it or runs it eagerly
        (counting it either way); without a runner it runs eagerly, counted under ``runnerless_reason``.

        Decode: a row per request; verify: a row per token; extend: a row per request (its last token). A batch the
        model runner built with adapters (``decode_batch``, ``extend_batch``, ``verify_batch``) goes to the LoRA
        variant; verify steps have none, so theirs run eagerly with the adapters applied."""
        mode = batch.forward_mode
        uses_lora = batch is self._lora_batch
        runner = self._runner_for(mode, uses_lora)
        if runner is not None:
            # The route the batch carries (``step_inputs`` gave it when the batch was built), else routed there.
            return runner.replay(batch)
        lifecycle.refuse_while_asleep(self)
        phase = Phase.PREFILL if mode.is_extend() else Phase.DECODE
        if uses_lora:
            self.lora_cuda_graph_metrics[phase].count_eager(self.runnerless_reason(phase), batch.num_tokens)
            return self.lora_forward(batch)
        metrics = self.verify_cuda_graph_metrics if mode.is_verify() else self.cuda_graph_metrics[phase]
        metrics.count_eager(self.runnerless_reason(phase), batch.num_tokens)
        return self.forward(batch)

    def _runner_for(self, mode: ForwardMode, lora: bool) -> DecodeCudaGraphRunner | PrefillCudaGraphRunner | None:
        """The runner of a step of ``mode``, of the LoRA variant when ``lora`` (none for verify steps)."""
        if mode.is_extend():
            return self.lora_prefill_cuda_graph_runner if lora else self.prefill_cuda_graph_runner
        if mode.is_verify():
            return None if lora else self.verify_cuda_graph_runner
        return self.lora_decode_cuda_graph_runner if lora else self.decode_cuda_graph_runner

    def input_views(self, mode: ForwardMode, batch_size: int) -> Mapping[str, torch.Tensor] | None:
        """Where a decode or verify step of ``batch_size`` requests can be written so that its replay copies nothing
        (the runner's ``input_views``); ``None`` for extend steps, without a runner, or when the step would run
        eagerly."""
        step = self._uniform_step_inputs(mode, batch_size)
        return step.views if step is not None else None

    def _uniform_step_inputs(self, mode: ForwardMode, batch_size: int, lora: bool = False) -> StepInputs | None:
        """The route and input views of a decode or verify step (``None`` for extend steps or without a runner), on
        the LoRA variant's runner when ``lora``."""
        runner = None if mode.is_extend() else self._runner_for(mode, lora)
        if runner is None:
            return None
        assert isinstance(runner, DecodeCudaGraphRunner)
        return runner.step_inputs(batch_size)

    def _built(self, batch: ForwardBatch, lora: bool) -> ForwardBatch:
        """``batch``, remembered as the LoRA step when ``lora`` (its indices are written): ``run`` reads this."""
        self._lora_batch = batch if lora else None
        return batch

    def extend_batch(self, requests: list[Request], limits: list[int] | None = None) -> ForwardBatch:
        """The extend step of ``requests`` (``batch.make_extend_batch``, chunks of at most ``limits``), written into
        the prefill graph's input views where it will replay one (the replay then copies nothing), carrying its
        route (routed once, here)."""
        lens = extend_lens(requests, limits)
        lora = self._write_lora_step(requests, lens)
        runner = self._runner_for(ForwardMode.EXTEND, lora)
        if runner is None:
            return self._built(make_extend_batch(requests, self.device, limits), lora)
        assert isinstance(runner, PrefillCudaGraphRunner)
        step = runner.step_inputs(sum(lens), len(requests))
        return self._built(_routed(make_extend_batch(requests, self.device, limits, step.views), step), lora)

    def decode_batch(self, requests: list[Request]) -> ForwardBatch:
        """The decode step of ``requests`` (``batch.make_decode_batch``), written into the decode graph's input
        views where it will replay one (the replay then copies nothing), carrying its route."""
        lora = self._write_lora_step(requests, [1] * len(requests))
        step = self._uniform_step_inputs(ForwardMode.DECODE, len(requests), lora)
        if step is None:
            return self._built(make_decode_batch(requests, self.device), lora)
        return self._built(_routed(make_decode_batch(requests, self.device, step.views), step), lora)

    def verify_batch(self, requests: list[Request], drafts: list[list[int]]) -> ForwardBatch:
        """The verify step of ``requests`` and their ``drafts`` (``batch.make_verify_batch``), written into the verify
        graph's input views where it will replay one, carrying its route."""
        lora = self._write_lora_step(requests, [len(draft) + 1 for draft in drafts])
        step = self._uniform_step_inputs(ForwardMode.TARGET_VERIFY, len(requests), lora)
        if step is None:
            return self._built(make_verify_batch(requests, drafts, self.device), lora)
        return self._built(_routed(make_verify_batch(requests, drafts, self.device, step.views), step), lora)

    def runnerless_reason(self, phase: Phase) -> EagerReason:
        """Why ``phase`` has no graph runner, decided here once for ``_init_runner`` (which makes a runner only on
        ``NOT_CAPTURED``) and for the steps that then run eagerly: there is no CUDA device ("graphs off", whatever the
        config says), its graphs are disabled (the config's decision), or ``NOT_CAPTURED`` (not yet, or not any
        more)."""
        if self.graphs_unavailable_reason(phase) is not None:
            return EagerReason.GRAPHS_UNAVAILABLE
        if not self.cuda_graph_config.for_phase(phase).enabled:
            return EagerReason.PHASE_DISABLED
        return EagerReason.NOT_CAPTURED

    def model_forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Hidden states ``[T, H]`` of the flat tokens: the part of ``forward`` that ``torch.compile`` traces whole.

        It reads no forward context and branches on no layer: the attention and KV-store operators read the step
        from the forward context inside themselves, so dynamo sees one graph for every layer and every token count
        (what the ``tc_piecewise`` backend compiles and splits at the attention op).
        """
        return self.model.forward(input_ids, positions, attend)

    @torch.no_grad()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Eager forward of ``batch`` (also what the graph runners capture): logits ``[B, vocab]``, or in a verify
        step ``[T, vocab]`` (every token's: each draft is checked against the logits of the token before it)."""
        if batch.forward_mode.is_idle():
            # Nothing to compute eagerly; a decode graph replays idle batches when it must keep ranks in step.
            return torch.empty((0, self.model.config.vocab_size), dtype=torch.float32, device=self.device)
        self.attn_backend.init_forward_metadata(batch)
        # Under a backend that compiled the model forward (tc_piecewise, full with compiled small buckets), that
        # backend's compiled forward runs instead.
        model_forward = compiled_model_forward() or self.model_forward
        context = ForwardContext(forward_batch=batch, attn_backend=self.attn_backend, extra={})
        with set_forward_context(context):
            hidden = model_forward(batch.input_ids, batch.positions)
        if self.hidden_states_buffer is not None:
            self.hidden_states_buffer[: hidden.shape[0]].copy_(hidden)
        if batch.forward_mode.is_extend():
            assert batch.extend_start_loc is not None and batch.extend_seq_lens is not None
            # Each request's last new token; padded requests (no tokens) clamp to row 0 and are sliced off later.
            last_token = (batch.extend_start_loc + batch.extend_seq_lens - 1).clamp_min(0)
            hidden = hidden.index_select(0, last_token)
        return self.model.compute_logits(hidden)


def _routed(batch: ForwardBatch, step: StepInputs) -> ForwardBatch:
    """``batch`` carrying the route its runner gave for it (``ForwardBatch.route``), so it is not routed again."""
    batch.route = step.route
    return batch
