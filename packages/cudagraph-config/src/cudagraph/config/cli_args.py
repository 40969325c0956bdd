"""A resolved config written back as command-line flags: the inverse of ``resolve`` over ``flags``.

Sits beside the flag table, above the data it renders: it reads a ``CudaGraphConfig`` and the option names in
``vocabulary``, and never parses anything. ``CudaGraphConfig.to_cli_args`` calls it. Never imports torch.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .bucket_schedules import default_buckets
from .phase_config import PhaseConfig
from .vocabulary import (
    BUCKETS_OPTIONS,
    CAPTURE_POLICY_OPTIONS,
    COMPILE_CACHE_DIR_OPTION,
    COMPILER_OPTION,
    DEFAULT_CAPTURE_POLICY,
    MAX_SIZE_OPTIONS,
    MEMORY_BUDGET_OPTIONS,
    MODE_OPTION,
    PADDING_RATIO_OPTIONS,
    SWITCH_OPTIONS,
    TC_PIECEWISE_COMPILERS,
    TORCH_COMPILE_MODE_OPTION,
    TORCH_COMPILE_OPTION,
    ConfigError,
    Phase,
)

if TYPE_CHECKING:  # only the annotation: the config type calls this module, not the other way round
    from .types import CudaGraphConfig


def config_cli_args(config: CudaGraphConfig) -> list[str]:
    """Flags that resolve back to a config equal to ``config`` in any environment (``CudaGraphConfig.to_cli_args``).

    The backends go into ``--cuda-graph-mode``, which locks them against compatibility rules; buckets are spelled out
    unless they are the default schedule of their max, in which case the max alone says it. Padding ratios, memory
    budgets, a lazy capture policy and the compile cache directory follow as their own flags when set. A config that
    no flags can give (an enabled phase without buckets, or whose last bucket is not its max) is a ``ConfigError``.
    """
    args = [MODE_OPTION, json.dumps({phase.value: config.backend(phase).value for phase in Phase})]
    for phase in Phase:
        phase_config = config.for_phase(phase)
        if phase_config.enabled:
            args += _phase_args(phase, phase_config)
    if config.tc_piecewise_compiler != TC_PIECEWISE_COMPILERS[0]:
        args += [COMPILER_OPTION, config.tc_piecewise_compiler]
    if config.torch_compile_max_bs:
        args += [TORCH_COMPILE_OPTION, str(config.torch_compile_max_bs)]
    if config.torch_compile_mode is not None:
        args += [TORCH_COMPILE_MODE_OPTION, config.torch_compile_mode]
    if config.compile_cache_dir is not None:
        args += _option_with_value(COMPILE_CACHE_DIR_OPTION, config.compile_cache_dir)
    args += [option for switch, option in SWITCH_OPTIONS.items() if getattr(config, switch)]
    return args


def _phase_args(phase: Phase, phase_config: PhaseConfig) -> list[str]:
    """The flags of one enabled phase's buckets (or max), padding ratio and memory budget."""
    buckets, max_size = phase_config.buckets, phase_config.max_size
    if not buckets:
        raise ConfigError(f"{phase}: backend {phase_config.backend} with no buckets cannot be written as flags")
    if max_size != buckets[-1]:
        raise ConfigError(
            f"{phase}: max_size {max_size} is not the last bucket {buckets[-1]}, which flags cannot give (resolve "
            "always ends the buckets at the max); make the max the last bucket"
        )
    if buckets == default_buckets(phase, max_size):
        args = [MAX_SIZE_OPTIONS[phase], str(max_size)]
    else:
        args = [BUCKETS_OPTIONS[phase], *(str(size) for size in buckets)]
    if phase_config.max_padding_ratio is not None:
        args += [PADDING_RATIO_OPTIONS[phase], repr(phase_config.max_padding_ratio)]
    if phase_config.memory_budget is not None:
        args += [MEMORY_BUDGET_OPTIONS[phase], str(phase_config.memory_budget)]
    if phase_config.capture_policy is not DEFAULT_CAPTURE_POLICY:
        args += [CAPTURE_POLICY_OPTIONS[phase], phase_config.capture_policy.value]
    return args


def _option_with_value(option: str, value: str) -> list[str]:
    # A value that starts with "-" would read as an option of its own; argparse takes it glued to its flag.
    return [f"{option}={value}"] if value.startswith("-") else [option, value]
