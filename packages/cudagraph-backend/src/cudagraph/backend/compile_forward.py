"""Compiling a host model runner's traceable forward with ``torch.compile``, once, for the backends that do.

``tc_piecewise`` (split at the split ops, each piece graphed) and ``full`` with compiled small buckets (the compiled
forward inside the one graph) share this: the host model runner's ``model_forward(input_ids, positions)`` is compiled
with ``fullgraph=True`` by running one static batch under the compile-warm-up flag, the token dimension marked
dynamic so one compilation serves every bucket. ``CompileStats`` counts what compiling cost and whether anything
compiled again later (a recompile after capture is a bug: a dynamo guard failed). A forward that does not trace
whole raises ``ModelTraceError`` naming the function, the line dynamo stopped at and its reason.

Torch's compile caches (inductor's FX-graph cache and AOTAutograd's cache, on by default, on disk under
``TORCHINDUCTOR_CACHE_DIR``) make a second process start reuse the first one's kernels: ``CompileStats`` reports
the cache hits and misses of each compilation, so a warm start is visible in the log.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.fx
import torch.fx.experimental._config as fx_config

from cudagraph.backend_utils import enable_torch_compile_warmup, use_compiled_model_forward
from cudagraph.config import read_torch_compile_mode

from .inductor_fallbacks import custom_ops_of, register_inductor_fallbacks

__all__ = [
    "CompileStats",
    "ModelTraceError",
    "compile_model_forward",
    "counting_inductor",
    "inductor_cache_counts",
    "inductor_mode_options",
]


class ModelTraceError(RuntimeError):
    """``torch.compile`` could not trace the model forward into one graph: the message names the function, the
    source line dynamo stopped at, and dynamo's reason."""


@dataclass
class CompileStats:
    """What compiling the model forward cost, and whether it compiled again after capture."""

    compilations: int = 0
    """Times dynamo handed a graph to the compiler: 1 for a forward that traces whole and never recompiles."""
    compile_seconds: float = 0.0
    """Wall time of compiling, tracing included, over every compilation made through ``compile_model_forward``."""
    cache_hits: int = 0
    """Inductor FX-graph cache hits while compiling (a warm start reuses kernels compiled by an earlier process)."""
    cache_misses: int = 0
    """Inductor FX-graph cache misses while compiling (kernels compiled from scratch)."""
    compilations_at_capture: int = 0
    """``compilations`` when the capture finished; any later one happened at replay."""

    @property
    def recompiles(self) -> int:
        """Compilations after the first: each one is a guard that failed, so a bug for a forward compiled once."""
        return max(0, self.compilations - 1)

    @property
    def recompiles_at_replay(self) -> int:
        """Compilations after capture finished (a dynamo guard failed at replay: those steps ran without graphs)."""
        return max(0, self.compilations - self.compilations_at_capture) if self.compilations_at_capture else 0

    def summary(self) -> str:
        """One phrase for the log: compilations, seconds and cache use."""
        cache = f"cache {self.cache_hits} hit / {self.cache_misses} miss"
        return f"{self.compilations} compilation(s) in {self.compile_seconds:.2f} s ({cache})"


def inductor_cache_counts() -> tuple[int, int]:
    """Inductor's FX-graph cache (hits, misses) so far in this process (torch's own counters)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["fxgraph_cache_hit"]), int(counters["inductor"]["fxgraph_cache_miss"])


CompilerBackend = Callable[[torch.fx.GraphModule, Sequence[Any]], Callable[..., Any]]
"""A ``torch.compile`` backend: ``(graph_module, example_inputs) -> callable``."""


def inductor_mode_options(mode: str | None, label: str = "torch.compile mode") -> dict[str, Any]:
    """The inductor config patches that ``torch.compile`` mode ``mode`` stands for (``None``: none, inductor's
    defaults), for compiling through ``compile_fx`` directly.

    ``mode`` must be one of ``cudagraph.config.TORCH_COMPILE_MODES`` (``--torch-compile-mode``); anything else, a mode
    that captures its own CUDA graphs included, is a ``ConfigError`` naming ``label`` and the allowed modes.
    """
    if mode is None:
        return {}
    read_torch_compile_mode(label, mode)
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode))


def counting_inductor(stats: CompileStats, mode: str | None = None) -> CompilerBackend:
    """Inductor as a ``torch.compile`` backend that counts each compilation in ``stats`` (and registers the
    fallbacks of the custom ops a graph calls first: ``register_inductor_fallbacks``).

    ``mode`` is one of ``cudagraph.config.TORCH_COMPILE_MODES`` (``None``: inductor's defaults;
    ``"max-autotune-no-cudagraphs"`` tunes Triton matmul templates against cuBLAS). ``reduce-overhead`` and
    ``max-autotune`` are a ``ConfigError``: their cudagraph trees would capture inside our capture.
    """
    from torch._inductor.compile_fx import compile_fx

    patches = inductor_mode_options(mode, "counting_inductor mode")

    def compile_counted(graph_module: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        stats.compilations += 1
        register_inductor_fallbacks(custom_ops_of(graph_module))
        return cast(Callable[..., Any], compile_fx(graph_module, list(example_inputs), config_patches=patches))

    return compile_counted


def compile_model_forward(
    model_forward: Callable[..., Any],
    run_once: Callable[[], Any],
    token_inputs: Sequence[torch.Tensor],
    compiler_backend: CompilerBackend,
    stats: CompileStats,
) -> Callable[..., Any]:
    """``torch.compile(model_forward, fullgraph=True)``, compiled now by calling ``run_once``.

    ``run_once`` runs the host runner's whole step (attention metadata, forward context) with
    ``compiled_model_forward()`` returning the compiled function, so the compilation sees the step's real inputs;
    ``token_inputs`` (that step's ``input_ids`` and ``positions``) get their first dimension marked dynamic. The
    compile runs with ``backed_size_oblivious`` so that dynamo does not specialize the token count on 0 or 1: one
    graph then serves every bucket. Raises ``ModelTraceError`` when the forward does not trace whole.
    """
    compiled = torch.compile(model_forward, backend=compiler_backend, fullgraph=True)
    for tensor in token_inputs:
        torch._dynamo.mark_dynamic(tensor, 0)
    started = time.perf_counter()
    hits_before, misses_before = inductor_cache_counts()
    with (
        fx_config.patch(backed_size_oblivious=True),  # type: ignore[attr-defined]
        enable_torch_compile_warmup(),
        use_compiled_model_forward(compiled),
    ):
        try:
            run_once()
        except Exception as error:
            if is_trace_error(error):
                raise trace_error(model_forward, error) from error
            raise
    hits_after, misses_after = inductor_cache_counts()
    stats.compile_seconds += time.perf_counter() - started
    stats.cache_hits += hits_after - hits_before
    stats.cache_misses += misses_after - misses_before
    return compiled


def trace_error(function: Callable[..., Any], error: Exception) -> ModelTraceError:
    """One error naming the function, the source line dynamo stopped at and dynamo's reason."""
    name = getattr(function, "__qualname__", repr(function))
    module = getattr(function, "__module__", "?")
    frames = getattr(error, "real_stack", None) or []
    if frames:
        where = f"{frames[-1].filename}:{frames[-1].lineno} ({frames[-1].name})"
    else:  # dynamo's message ends with the user frames: 'File "<path>", line <n>, in <name>'
        user_frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', str(error).rpartition("from user code:")[2])
        where = (
            f"{user_frames[-1][0]}:{user_frames[-1][1]} ({user_frames[-1][2]})" if user_frames else "an unknown line"
        )
    reason = str(error).split("\n\nfrom user code:", 1)[0].strip().splitlines()
    summary = reason[0] if reason else type(error).__name__
    return ModelTraceError(
        f"torch.compile could not trace {module}.{name} into one graph: dynamo stopped at {where}: "
        f"{type(error).__name__}: {summary}. Make that code traceable (read per-step state inside a registered "
        f"op, pass a layer's identity as an op argument), or use the breakable backend for this phase."
    )


def is_trace_error(error: Exception) -> bool:
    """Whether ``error`` is dynamo failing to trace (rather than the model itself failing)."""
    from torch._dynamo import exc

    return isinstance(error, exc.Unsupported | exc.UserError | exc.TorchRuntimeError | exc.BackendCompilerFailed)
