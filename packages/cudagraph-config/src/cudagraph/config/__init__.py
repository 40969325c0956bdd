"""Resolve one canonical per-phase CUDA-graph mode from JSON, per-phase flags, other engines' spellings, legacy flags
and keyword arguments.

Pure Python: this package never imports torch. It also owns ``refactor/renames.toml``, the one table of legacy names
and their replacements, and its reader (``load_renames``), which the codemods and the shims read too.

Example:
    >>> import argparse
    >>> from cudagraph.config import Phase, add_cli_args, resolve
    >>> parser = argparse.ArgumentParser()
    >>> _ = add_cli_args(parser)
    >>> config = resolve(parser.parse_args(["--cuda-graph-mode", '{"prefill": "tc_piecewise"}']))
    >>> config.backend(Phase.DECODE).value, config.backend(Phase.PREFILL).value
    ('full', 'tc_piecewise')
"""

from .bucket_schedules import BUCKET_SCHEDULES, DECODE_MAX_BS_BY_GPU_MEMORY, default_buckets
from .environment import Environment
from .flags import ALIAS_FLAGS, LEGACY_FLAGS, MODERN_FLAGS, SGLANG_FLAGS, VLLM_FLAGS, add_cli_args
from .legacy_values import LEGACY_BACKEND_VALUES
from .memory_budget import MemoryBudget, read_memory_budget
from .phase_config import exceeds_padding_ratio, smallest_bucket_holding
from .renames import Rename, RenameKind, RenameTable, RenameTableError, load_renames, renames_path
from .resolve import resolve
from .rules import COMPATIBILITY_RULES, CompatibilityRule, RuleContext
from .types import CudaGraphConfig, PhaseConfig
from .values import backend_for_phase, read_padding_ratio, read_phase, read_torch_compile_mode
from .vllm import VLLM_CUDAGRAPH_MODES
from .vocabulary import (
    ALLOWED_BACKENDS_PER_PHASE,
    BUCKETS_OPTIONS,
    CAPTURE_POLICY_OPTIONS,
    DEFAULT_CAPTURE_POLICY,
    DEFAULT_CUDA_GRAPH_MODE,
    DEFAULT_MAX_SIZE,
    MAX_SIZE_OPTIONS,
    MEMORY_BUDGET_OPTIONS,
    PADDING_RATIO_OPTIONS,
    TC_PIECEWISE_COMPILERS,
    TORCH_COMPILE_MODES,
    Backend,
    CapturePolicy,
    ConfigError,
    LegacyFlagWarning,
    OverriddenSettingWarning,
    Phase,
)

__version__ = "0.1.0"

__all__ = [
    "ALIAS_FLAGS",
    "ALLOWED_BACKENDS_PER_PHASE",
    "BUCKETS_OPTIONS",
    "BUCKET_SCHEDULES",
    "CAPTURE_POLICY_OPTIONS",
    "COMPATIBILITY_RULES",
    "DECODE_MAX_BS_BY_GPU_MEMORY",
    "DEFAULT_CAPTURE_POLICY",
    "DEFAULT_CUDA_GRAPH_MODE",
    "DEFAULT_MAX_SIZE",
    "LEGACY_BACKEND_VALUES",
    "LEGACY_FLAGS",
    "MAX_SIZE_OPTIONS",
    "MEMORY_BUDGET_OPTIONS",
    "MODERN_FLAGS",
    "PADDING_RATIO_OPTIONS",
    "SGLANG_FLAGS",
    "TC_PIECEWISE_COMPILERS",
    "TORCH_COMPILE_MODES",
    "VLLM_CUDAGRAPH_MODES",
    "VLLM_FLAGS",
    "Backend",
    "CapturePolicy",
    "CompatibilityRule",
    "ConfigError",
    "CudaGraphConfig",
    "Environment",
    "LegacyFlagWarning",
    "MemoryBudget",
    "OverriddenSettingWarning",
    "Phase",
    "PhaseConfig",
    "Rename",
    "RenameKind",
    "RenameTable",
    "RenameTableError",
    "RuleContext",
    "__version__",
    "add_cli_args",
    "backend_for_phase",
    "default_buckets",
    "exceeds_padding_ratio",
    "load_renames",
    "read_memory_budget",
    "read_padding_ratio",
    "read_phase",
    "read_torch_compile_mode",
    "renames_path",
    "resolve",
    "smallest_bucket_holding",
]
