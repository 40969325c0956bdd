"""``cudagraph-engine``: generate tokens or time decode steps with a model directory or a random-weight preset.

Scripts drive ``generate --json``: stdout then holds exactly one JSON object, ``{"outputs": [{"output_token_ids":
[...]}, ...]}``, one entry per ``--prompt-token-ids`` in order; everything else (why graphs are off, capture
progress) goes to stderr. The CUDA-graph flags are those of ``cudagraph.config.add_cli_args``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch

from cudagraph.config import Backend, ConfigError, CudaGraphConfig, Environment, Phase, add_cli_args, resolve

from .attention import ATTENTION_BACKENDS, AttentionBackendUnavailableError
from .batch import SamplingParams
from .benchmark import bench_decode, format_table
from .generate import generate
from .kv_cache import MAX_PAGE_SIZE, check_page_size
from .model import (
    KERNEL_BACKEND_CHOICES,
    PRESETS,
    CausalLM,
    KernelBackendError,
    ModelLoadError,
    load_model,
    model_config_from_preset,
    random_model,
)
from .model_runner import CacheConfig, ModelRunner

logger = logging.getLogger("cudagraph.engine")

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
EXIT_USAGE = 2
"""Bad input (an option, a model directory, a prompt): one line on stderr, no traceback (``--debug`` shows it)."""
LOG_FORMAT = "[%(asctime)s] %(levelname)s %(name)s: %(message)s"
"""One format, with timestamps, for every cudagraph logger."""


class EngineInputError(ValueError):
    """Input the engine cannot run with, found before any work: the message says what and what is allowed."""


EXPECTED_ERRORS: tuple[type[Exception], ...] = (
    EngineInputError,
    ModelLoadError,
    ConfigError,
    AttentionBackendUnavailableError,
    KernelBackendError,
)
"""Errors that are the user's input, reported in one line; anything else is a bug and keeps its traceback."""


class _OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the problem (``--help`` shows the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def token_ids(text: str) -> list[int]:
    """Parse ``1,2,3`` into token ids (argparse type)."""
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of token ids, e.g. 1,2,3") from None
    if not ids or any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"{text!r} must hold at least one non-negative token id, e.g. 1,2,3")
    return ids


def page_size(text: str) -> int:
    """Parse ``--page-size`` (argparse type): a power of two up to ``MAX_PAGE_SIZE``."""
    try:
        return check_page_size(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a power of two up to {MAX_PAGE_SIZE}; allowed: 1, 2, 4, ... {MAX_PAGE_SIZE}"
        ) from None


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="Hugging Face model directory (config.json + safetensors)")
    source.add_argument("--preset", choices=sorted(PRESETS), help="random-weight model of a known shape")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto", help="compute dtype (auto: the checkpoint's)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--model-seed", type=int, default=0, help="seed of a preset's random weights")
    parser.add_argument("--attention-backend", choices=sorted(ATTENTION_BACKENDS), default="torch")
    parser.add_argument(
        "--kernel-backend",
        choices=KERNEL_BACKEND_CHOICES,
        default="auto",
        help="the layers' norm/rotary/activation kernels (auto: flashinfer when installed and the model runs in "
        "float16/bfloat16 on CUDA without tc_piecewise, else torch)",
    )
    parser.add_argument("--max-num-reqs", type=int, default=64, help="request rows in the KV cache")
    parser.add_argument("--max-context-len", type=int, default=1024, help="tokens per request in the KV cache")
    parser.add_argument(
        "--page-size",
        type=page_size,
        default=1,
        help=f"tokens per KV cache page: a power of two up to {MAX_PAGE_SIZE} (default 1)",
    )
    loudness = parser.add_mutually_exclusive_group()
    loudness.add_argument("-v", "--verbose", action="store_true", help="also log debug detail")
    loudness.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only, no capture bar")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an input error")
    add_cli_args(parser)


def build_parser() -> argparse.ArgumentParser:
    """The ``cudagraph-engine`` argument parser (``generate`` and ``bench``)."""
    parser = _OneLineErrorParser(prog="cudagraph-engine", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineErrorParser)

    gen = commands.add_parser("generate", help="generate tokens for one or more prompts (token ids)")
    _add_model_args(gen)
    gen.add_argument(
        "--prompt-token-ids",
        type=token_ids,
        action="append",
        required=True,
        metavar="1,2,3",
        help="a prompt as comma-separated token ids; repeat for more prompts",
    )
    gen.add_argument("--max-new-tokens", type=int, default=16)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    gen.add_argument("--seed", type=int, default=0, help="sampling seed (with --temperature)")
    gen.add_argument("--json", action="store_true", help="print only the JSON result on stdout")

    bench = commands.add_parser("bench", help="time decode steps: eager against the configured decode graphs")
    _add_model_args(bench)
    bench.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    bench.add_argument("--context-len", type=int, default=128, help="cached tokens per request")
    bench.add_argument("--steps", type=int, default=30)
    bench.add_argument("--json", action="store_true", help="print only the JSON result on stdout")
    bench.add_argument("--output", type=Path, default=None, help="also write the JSON result to this file")
    return parser


def _device(args: argparse.Namespace) -> torch.device:
    if args.device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(args.device)
    except RuntimeError as error:
        raise EngineInputError(f"--device {args.device!r}: {error}; use cuda, cuda:N or cpu") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise EngineInputError(
            f"--device {args.device}: CUDA is not available here (torch {torch.__version__}, "
            f"{torch.cuda.device_count()} GPUs visible); use --device cpu"
        )
    return device


def check_prompts_fit(args: argparse.Namespace) -> None:
    """Every prompt plus its new tokens must fit a request's KV cache rows (``--max-context-len``)."""
    for index, prompt in enumerate(args.prompt_token_ids):
        needed = len(prompt) + args.max_new_tokens
        if needed > args.max_context_len:
            raise EngineInputError(
                f"prompt {index} has {len(prompt)} tokens and asks for {args.max_new_tokens} more, {needed} in all, "
                f"but the KV cache holds {args.max_context_len} per request: raise --max-context-len or shorten it"
            )


def environment_of(device: torch.device) -> Environment:
    """What ``resolve`` needs to know about ``device`` (its compatibility rules turn graphs off off CUDA)."""
    memory_gib = None
    if device.type == "cuda":
        memory_gib = torch.cuda.get_device_properties(device).total_memory / 2**30
    return Environment(device_type=device.type, gpu_memory_gib=memory_gib)


def load_engine_model(args: argparse.Namespace, device: torch.device) -> CausalLM:
    """The model ``--model`` or ``--preset`` names, on ``device`` in ``--dtype``."""
    if args.model is not None:
        return load_model(args.model, dtype=args.dtype, device=device)
    return random_model(model_config_from_preset(args.preset), seed=args.model_seed, dtype=args.dtype, device=device)


def build_model_runner(args: argparse.Namespace, config: CudaGraphConfig, *, capture: bool = True) -> ModelRunner:
    """Model, KV cache and attention backend from the arguments; with ``capture``, the graphs ``config`` allows."""
    device = _device(args)
    model = load_engine_model(args, device)
    cache = CacheConfig(max_num_reqs=args.max_num_reqs, max_context_len=args.max_context_len, page_size=args.page_size)
    runner = ModelRunner(
        model,
        config,
        cache_config=cache,
        attention_backend=args.attention_backend,
        kernel_backend=args.kernel_backend,
        show_progress=not args.quiet,
    )
    if capture:
        runner.init_cuda_graphs()
    return runner


def run_generate(args: argparse.Namespace, config: CudaGraphConfig) -> dict[str, Any]:
    """Generate for every prompt; the JSON-ready result."""
    check_prompts_fit(args)
    model_runner = build_model_runner(args, config)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed)
    outputs = generate(model_runner, args.prompt_token_ids, params)
    model_runner.shutdown()
    return {"outputs": [{"output_token_ids": output.output_token_ids} for output in outputs]}


def run_bench(args: argparse.Namespace, config: CudaGraphConfig) -> dict[str, Any]:
    """Time eager decode steps and, on CUDA, the configured decode backend; the JSON-ready result."""
    # bench_decode captures exactly the batch sizes it times, with the configured decode backend.
    too_many = [size for size in args.batch_sizes if size > args.max_num_reqs or size < 1]
    if too_many:
        raise EngineInputError(
            f"--batch-sizes {' '.join(map(str, too_many))}: each must be between 1 and --max-num-reqs "
            f"({args.max_num_reqs}), the KV cache's request rows"
        )
    model_runner = build_model_runner(args, config, capture=False)
    modes = ["eager"]
    reason = model_runner.graphs_unavailable_reason(Phase.DECODE)
    if reason is None:
        modes += ["raw", str(config.decode.backend)]
    timings = bench_decode(model_runner, args.batch_sizes, modes, context_len=args.context_len, steps=args.steps)
    return {
        "device": str(model_runner.device),
        "dtype": str(model_runner.dtype).removeprefix("torch."),
        "graphs": reason or f"decode {config.decode.backend}",
        "kernels": model_runner.kernels.name,
        "timings": [timing.as_dict() for timing in timings],
        "table": format_table(timings),
    }


COMMANDS = {"generate": run_generate, "bench": run_bench}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``cudagraph-engine`` and ``python -m cudagraph.engine``."""
    args = build_parser().parse_args(argv)
    # Like SGLang: INFO by default (a capture bar, one summary line per runner), -q for warnings only.
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr)
    try:
        return _run(args)
    except EXPECTED_ERRORS as error:
        if args.debug:
            traceback.print_exc(file=sys.stderr)
        print(f"cudagraph-engine {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    config = resolve(args, environment=environment_of(_device(args)))
    if config.backend(Phase.DECODE) is Backend.DISABLED and config.backend(Phase.PREFILL) is Backend.DISABLED:
        logger.info("CUDA graphs are disabled for both phases; every step runs eagerly")
    result = COMMANDS[args.command](args, config)
    text = json.dumps(result)
    if args.command == "bench":
        if args.output is not None:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(result, indent=2) + "\n")
        if not args.json:
            kernels = f"{result['kernels']} kernels"
            print(f"decode step on {result['device']} ({result['dtype']}, {kernels}, {result['graphs']})")
            print(result["table"])
            return 0
    elif not args.json:
        for index, output in enumerate(result["outputs"]):
            print(f"prompt {index}: {output['output_token_ids']}")
        return 0
    print(text)
    return 0
