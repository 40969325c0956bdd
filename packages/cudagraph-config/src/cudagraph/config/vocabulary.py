"""The words of CUDA-graph configuration: phases, backends, compilers, option names, defaults, and the one error type.

Pure data with no dependencies inside the package (its imports are the standard library only), so every other module
can import it, and a reader finds every identifier and default in one place. How a flag's value is read, and the
flag table itself, are ``flags``'s. Never imports torch.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType


class Phase(str, enum.Enum):
    """A forward phase that can be graphed: decode steps keyed by batch size, prefill keyed by token count."""

    DECODE = "decode"
    PREFILL = "prefill"

    def __str__(self) -> str:
        return self.value


class Backend(str, enum.Enum):
    """How a phase is captured and replayed (``disabled``: always eager)."""

    FULL = "full"
    BREAKABLE = "breakable"
    TC_PIECEWISE = "tc_piecewise"
    DISABLED = "disabled"

    def __str__(self) -> str:
        return self.value


class CapturePolicy(str, enum.Enum):
    """When a phase's graphs are captured: ``eager`` captures every bucket at start-up (before the first step);
    ``lazy`` captures a bucket the first time a step is routed to it, and that step replays it."""

    EAGER = "eager"
    LAZY = "lazy"

    def __str__(self) -> str:
        return self.value


DEFAULT_CAPTURE_POLICY = CapturePolicy.EAGER
"""Every bucket captured at start-up, as before capture policies existed."""

WHAT_EACH_CAPTURE_POLICY_DOES: Mapping[CapturePolicy, str] = MappingProxyType(
    {
        CapturePolicy.EAGER: "every bucket captured at start-up, before the first step",
        CapturePolicy.LAZY: "nothing captured at start-up; a bucket is captured by the first step routed to it, "
        "which replays it",
    }
)
"""Capture policy -> one line saying when graphs are captured (``--explain`` prints it)."""

DEFAULT_CUDA_GRAPH_MODE: Mapping[Phase, Backend] = MappingProxyType(
    {Phase.DECODE: Backend.FULL, Phase.PREFILL: Backend.BREAKABLE}
)
"""Decode replays one full graph; prefill graphs everything but attention."""

ALLOWED_BACKENDS_PER_PHASE: Mapping[Phase, frozenset[Backend]] = MappingProxyType(
    {
        Phase.DECODE: frozenset(Backend),
        # Prefill ``full`` captures attention for token buckets with a bounded number of requests (an attention
        # backend with static index buffers per bucket, such as FlashInfer's); other batches run eagerly.
        Phase.PREFILL: frozenset(Backend),
    }
)
"""The backends each phase accepts: every phase and backend pair of the design is allowed today. The table stays the
one place a future phase or backend that cannot pair is refused, with the message naming what is allowed."""

WHAT_EACH_BACKEND_CAPTURES: Mapping[Phase, Mapping[Backend, str]] = MappingProxyType(
    {
        Phase.DECODE: MappingProxyType(
            {
                Backend.FULL: "the whole forward, attention included, one graph per batch size",
                Backend.BREAKABLE: "everything but attention, one graph per batch size; attention runs eagerly",
                Backend.TC_PIECEWISE: "torch.compile pieces between the split ops, per batch size; "
                "attention runs eagerly",
                Backend.DISABLED: "nothing: every decode step runs eagerly",
            }
        ),
        Phase.PREFILL: MappingProxyType(
            {
                Backend.FULL: "the whole forward, attention included, one graph per token bucket holding at most "
                "min(bucket, request rows) requests; other batches run eagerly",
                Backend.BREAKABLE: "everything but attention, one graph per token bucket; attention runs eagerly",
                Backend.TC_PIECEWISE: "torch.compile pieces between the split ops, per token bucket; "
                "attention runs eagerly",
                Backend.DISABLED: "nothing: every prefill step runs eagerly",
            }
        ),
    }
)
"""Phase -> backend -> one line saying what its graphs hold (``--explain`` prints it)."""

STEPS_EACH_PHASE_GRAPHS: Mapping[Phase, str] = MappingProxyType(
    {
        Phase.DECODE: "uniform steps, keyed by request count: decode (1 token a request) and speculative verify "
        "(k + 1 tokens a request, a runner of its own)",
        Phase.PREFILL: "every other step, keyed by token count: prefill, chunked prefill, prefill mixed with decodes",
    }
)
"""Phase -> which steps its graphs replay (``--explain`` prints it): there is no verify phase, since a verify step
is uniform like decode and takes the decode phase's backend and buckets."""

TC_PIECEWISE_COMPILERS: tuple[str, ...] = ("eager", "inductor")
"""What torch.compile uses for the pieces of a ``tc_piecewise`` graph; the first is the default."""

TORCH_COMPILE_MODES: tuple[str, ...] = ("default", "max-autotune-no-cudagraphs", "lite")
"""The ``torch.compile`` modes an inductor-compiled forward may use inside our graphs: those that capture no CUDA
graphs of their own. ``default``: inductor's defaults; ``max-autotune-no-cudagraphs``: Triton matmul templates tuned
against cuBLAS, with coordinate-descent tuning (slower to compile); ``lite``: inductor falls back to the eager kernels
by default (numerics of eager, little fusion). Not setting a mode means inductor's defaults too."""

CUDA_GRAPH_COMPILE_MODES: tuple[str, ...] = ("reduce-overhead", "max-autotune")
"""``torch.compile`` modes that capture CUDA graphs of their own (inductor's cudagraph trees): refused, since those
graphs would be captured inside ours."""


DEFAULT_MAX_SIZE: dict[Phase, int] = {Phase.DECODE: 256, Phase.PREFILL: 2048}
"""The largest captured shape when neither the user nor the GPU memory says otherwise."""

DEFAULT_TORCH_COMPILE_MAX_BS = 32
"""SGLang's default largest batch compiled when ``--enable-torch-compile`` comes without ``--torch-compile-max-bs``."""


def _per_phase(decode: str, prefill: str) -> Mapping[Phase, str]:
    """A read-only ``Phase -> option`` table."""
    return MappingProxyType({Phase.DECODE: decode, Phase.PREFILL: prefill})


# Option strings: the flag table (``flags``) defines each flag once with these names; code that names a flag by its
# meaning (the flags a config renders back to, the flag an eager step's hint names) reads them here.
MODE_OPTION = "--cuda-graph-mode"
"""The JSON mode of every phase, the highest-precedence way to say one."""
BACKEND_OPTIONS: Mapping[Phase, str] = _per_phase("--decode-cuda-graph-backend", "--prefill-cuda-graph-backend")
"""Phase -> the flag that names its backend."""
DISABLE_OPTIONS: Mapping[Phase, str] = _per_phase("--decode-disable-cuda-graph", "--prefill-disable-cuda-graph")
"""Phase -> the switch that runs it eagerly."""
BUCKETS_OPTIONS: Mapping[Phase, str] = _per_phase("--decode-cuda-graph-bs", "--prefill-cuda-graph-tokens")
"""Phase -> the flag that lists its buckets (batch sizes for decode, token counts for prefill)."""
MAX_SIZE_OPTIONS: Mapping[Phase, str] = _per_phase("--decode-cuda-graph-max-bs", "--prefill-cuda-graph-max-tokens")
"""Phase -> the flag that sets its largest bucket."""
PADDING_RATIO_OPTIONS: Mapping[Phase, str] = _per_phase(
    "--decode-cuda-graph-max-padding-ratio", "--prefill-cuda-graph-max-padding-ratio"
)
"""Phase -> the flag that bounds how far a batch may be padded up to its bucket."""
MEMORY_BUDGET_OPTIONS: Mapping[Phase, str] = _per_phase(
    "--decode-cuda-graph-memory-budget", "--prefill-cuda-graph-memory-budget"
)
"""Phase -> the flag that caps the device memory its graphs take."""
CAPTURE_POLICY_OPTIONS: Mapping[Phase, str] = _per_phase(
    "--decode-cuda-graph-capture-policy", "--prefill-cuda-graph-capture-policy"
)
"""Phase -> the flag that says when its graphs are captured (``eager``: at start-up; ``lazy``: on first use)."""
COMPILER_OPTION = "--tc-piecewise-compiler"
"""The compiler of ``tc_piecewise`` pieces (one of ``TC_PIECEWISE_COMPILERS``)."""
COMPILE_CACHE_DIR_OPTION = "--tc-piecewise-compile-cache-dir"
"""Where inductor keeps its caches for compiled pieces."""
TORCH_COMPILE_OPTION = "--torch-compile-max-bs"
"""Full decode graphs of batch sizes up to this capture an inductor-compiled forward."""
TORCH_COMPILE_MODE_OPTION = "--torch-compile-mode"
"""The ``torch.compile`` mode of every inductor-compiled forward (one of ``TORCH_COMPILE_MODES``)."""
ENABLE_TORCH_COMPILE_OPTION = "--enable-torch-compile"
"""SGLang's switch for compiled small full decode graphs (up to ``DEFAULT_TORCH_COMPILE_MAX_BS`` unless said)."""
SWITCH_OPTIONS: Mapping[str, str] = MappingProxyType(
    {
        "debug": "--debug-cuda-graph",
        "enable_gc": "--enable-cudagraph-gc",
        "disable_padding": "--disable-cuda-graph-padding",
        "profile_capture": "--enable-profile-cuda-graph",
    }
)
"""``CudaGraphConfig`` switch field -> the flag that turns it on."""


class ConfigError(ValueError):
    """Bad CUDA-graph configuration input: the message names the flag or key, the value, and what is allowed."""


def allowed_backends(phase: Phase) -> tuple[Backend, ...]:
    """The backends ``phase`` accepts, in declaration order (for messages and help texts)."""
    return tuple(backend for backend in Backend if backend in ALLOWED_BACKENDS_PER_PHASE[phase])


def phase_key(phase: Phase, field_name: str) -> str:
    """The dotted settings key of one phase field, as used in ``CudaGraphConfig.sources`` (``"decode.buckets"``)."""
    return f"{phase.value}.{field_name}"


class LegacyFlagWarning(FutureWarning):
    """A deprecated CUDA-graph flag, keyword or value spelling was used; the message names its replacement.

    A ``FutureWarning`` (shown by default) because flags are typed by end users, who would never see a
    ``DeprecationWarning`` raised inside a library.
    """


class OverriddenSettingWarning(UserWarning):
    """The user gave one setting twice and the higher-precedence source won; the message names both."""
