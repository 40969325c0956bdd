"""Compatibility rules: named predicates over the environment that turn one phase's graphs off.

A rule never turns a phase on and never touches a phase named in ``--cuda-graph-mode`` (a locked phase); ``resolve``
applies the rows in order, logs each one that fires under the ``cudagraph.config`` logger, and records its name in
``CudaGraphConfig.sources``. Adding a rule is adding one row to ``COMPATIBILITY_RULES``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from .environment import Environment
from .vocabulary import Backend, Phase


@dataclass(frozen=True)
class RuleContext:
    """What a rule may look at: the environment, the phase's backend so far, and the debug switch."""

    environment: Environment
    phase: Phase
    backend: Backend
    debug: bool


@dataclass(frozen=True)
class CompatibilityRule:
    """One row: when ``applies`` holds, ``phase`` runs eagerly, for ``reason``."""

    name: str
    phase: Phase
    reason: str
    """Why, as a ``str.format`` template over the ``Environment`` fields."""
    applies: Callable[[RuleContext], bool]

    def why(self, environment: Environment) -> str:
        """The reason with the environment's values filled in."""
        return self.reason.format(**asdict(environment))

    def explain(self, environment: Environment) -> str:
        """``name: reason``, as recorded in ``CudaGraphConfig.sources`` and logged."""
        return f"{self.name}: {self.why(environment)}"


def _not_cuda(context: RuleContext) -> bool:
    return not context.environment.is_cuda


def _debug_with_tc_piecewise(context: RuleContext) -> bool:
    return context.debug and context.backend is Backend.TC_PIECEWISE


def _mla_with_breakable(context: RuleContext) -> bool:
    return context.environment.mla_attention and context.backend is Backend.BREAKABLE


_NOT_CUDA = "CUDA graphs need a CUDA device, and the device type is {device_type!r}"
_DEBUG_TC = "--debug-cuda-graph checks break the torch.compile graph that tc_piecewise splits"
_MLA_BREAKABLE = "MLA attention is not a registered break op, so a breakable graph would capture it"

COMPATIBILITY_RULES: tuple[CompatibilityRule, ...] = (
    CompatibilityRule("non_cuda_device", Phase.DECODE, _NOT_CUDA, _not_cuda),
    CompatibilityRule("non_cuda_device", Phase.PREFILL, _NOT_CUDA, _not_cuda),
    CompatibilityRule(
        "pipeline_parallel",
        Phase.PREFILL,
        "prefill graphs do not span pipeline stages (pipeline-parallel size {pipeline_parallel_size})",
        lambda context: context.environment.pipeline_parallel_size > 1,
    ),
    CompatibilityRule(
        "lora",
        Phase.PREFILL,
        "LoRA adapters vary per request inside prefill, which a graph cannot follow",
        lambda context: context.environment.lora,
    ),
    CompatibilityRule(
        "multimodal",
        Phase.PREFILL,
        "multimodal embeddings are merged into prefill inputs outside static buffers",
        lambda context: context.environment.multimodal,
    ),
    CompatibilityRule(
        "torch_compile_whole_model",
        Phase.PREFILL,
        "the whole model is already under torch.compile, which prefill graphs would wrap a second time",
        lambda context: context.environment.torch_compile,
    ),
    CompatibilityRule("debug_tc_piecewise", Phase.DECODE, _DEBUG_TC, _debug_with_tc_piecewise),
    CompatibilityRule("debug_tc_piecewise", Phase.PREFILL, _DEBUG_TC, _debug_with_tc_piecewise),
    CompatibilityRule("mla_breakable", Phase.DECODE, _MLA_BREAKABLE, _mla_with_breakable),
    CompatibilityRule("mla_breakable", Phase.PREFILL, _MLA_BREAKABLE, _mla_with_breakable),
)


def first_applicable_rule(context: RuleContext) -> CompatibilityRule | None:
    """The first row for ``context.phase`` whose predicate holds, or ``None``; a disabled phase matches none."""
    if context.backend is Backend.DISABLED:
        return None
    return next((rule for rule in COMPATIBILITY_RULES if rule.phase is context.phase and rule.applies(context)), None)
