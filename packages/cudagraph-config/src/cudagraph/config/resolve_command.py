"""``python -m cudagraph.config resolve [FLAGS...] [--json] [--explain]``: print a resolved config.

Environment flags (``--device-type``, ``--lora``...) describe the engine for the compatibility rules. A bad value
exits with status 2 and one ``error:`` line on stderr; warnings and rule logs go to stderr, results to stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import warnings
from collections.abc import Sequence

from .environment import Environment
from .flags import add_cli_args
from .resolve import resolve
from .vocabulary import SWITCH_OPTIONS, ConfigError

EXIT_CONFIG_ERROR = 2


def _add_environment_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("environment", "what the engine runs on; read by the compatibility rules")
    group.add_argument("--device-type", default="cuda", help="torch device type (default: cuda)")
    group.add_argument("--pipeline-parallel-size", type=int, default=1, metavar="N")
    group.add_argument("--lora", action="store_true", help="LoRA adapters are served")
    group.add_argument("--multimodal", action="store_true", help="the model takes image, audio or video inputs")
    group.add_argument("--mla-attention", action="store_true", help="the model uses multi-head latent attention")
    group.add_argument("--torch-compile", action="store_true", help="the whole model runs under torch.compile")
    group.add_argument("--gpu-memory-gib", type=float, default=None, metavar="GIB", help="memory of one GPU")


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m cudagraph.config`` argument parser."""
    parser = argparse.ArgumentParser(prog="python -m cudagraph.config", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    resolve_parser = commands.add_parser("resolve", help="resolve CUDA-graph flags and print the config")
    output = resolve_parser.add_argument_group("output")
    output.add_argument("--json", action="store_true", help="print a JSON object (decode/prefill: backend names)")
    output.add_argument("--explain", action="store_true", help="show where every value came from")
    add_cli_args(resolve_parser)
    _add_environment_args(resolve_parser)
    return parser


def _environment(args: argparse.Namespace) -> Environment:
    """The environment the flags describe: each field of ``Environment`` is the flag of its name."""
    return Environment(**{field.name: getattr(args, field.name) for field in dataclasses.fields(Environment)})


class _LevelFormatter(logging.Formatter):
    """``warning: message`` (``info: ...``, ``error: ...``): the format of the command's other stderr lines."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {record.getMessage()}"


def _stderr_handler() -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LevelFormatter())
    return handler


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    # one format for everything said on stderr: a log record reads like a Python warning, `warning: ...`
    logging.basicConfig(level=logging.INFO, handlers=[_stderr_handler()])
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            config = resolve(args, environment=_environment(args))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    if args.json:
        print(json.dumps(config.to_dict(), indent=2))
    elif args.explain:
        print(config.explain())
    else:
        for phase in ("decode", "prefill"):
            phase_config = config.for_phase(phase)
            limits = "".join(
                f" {name}={value}"
                for name in ("max_padding_ratio", "memory_budget")
                if (value := getattr(phase_config, name)) is not None
            )
            print(
                f"{phase}: {phase_config.backend} buckets={list(phase_config.buckets)} max={phase_config.max_size}"
                f"{limits}"
            )
        switches = " ".join(f"{switch}={getattr(config, switch)}" for switch in SWITCH_OPTIONS)
        print(
            f"tc_piecewise_compiler={config.tc_piecewise_compiler} "
            f"torch_compile_max_bs={config.torch_compile_max_bs} torch_compile_mode={config.torch_compile_mode} "
            f"compile_cache_dir={config.compile_cache_dir} {switches}"
        )
    return 0
