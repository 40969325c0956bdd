"""``cudagraph-engine``: generate tokens with a model directory or a random-weight preset.

Scripts drive ``generate --json``: stdout then holds exactly one JSON object, ``{"outputs": [{"output_token_ids":
[...]}, ...], "speed": {...}, "graph_variants": [...]}``, one output per ``--prompt-token-ids`` in order, under
``speed`` the ``speed.SpeedReport`` (prompt and generated tokens, time to first token, decode tokens per second, steps
replayed and eager, capture time and graph memory), which is also one ``speed:`` log line on stderr, and under
``graph_variants`` one ``variants.VariantReport`` per graph variant of each phase (plain; lora with its max rank;
verify): whether it is graphed, its steps replayed and eager, and why eager, also one ``graph variants:`` log line.
Everything else (why graphs are off, capture progress) goes to stderr. The CUDA-graph flags are those of
``cudagraph.config.add_cli_args``; ``generate --explain`` prints to stderr where each of their values came from
(``CudaGraphConfig.explain``) before any model work, and after the run the graph variants with their steps.

LoRA adapters (``lora_cli``): ``--enable-lora``, ``--lora-modules NAME=PATH ...`` (SGLang: ``--lora-paths``),
``--max-loras N`` (SGLang: ``--max-loras-per-batch``), ``--max-lora-rank R`` and ``--lora-name NAME`` (every prompt,
or one per prompt), checked, and every adapter read, before any model work.

``generate --cuda-graph-metrics [PATH]`` counts every step by where it went: at exit each phase's table (replays,
real and padded tokens per bucket, eager steps by reason with the flag that would capture them) goes to stderr and
the same as JSON, ``{"decode": {...}, "prefill": {...}}`` (``ReplayMetrics.to_dict()`` per phase; with LoRA also
``"decode lora"`` and ``"prefill lora"``, the steps of each phase's LoRA variant), to PATH (``cuda_graph_metrics.json``
in the working directory by default); stdout is unchanged, ``--json`` included.

``generate --estimate-cuda-graph-memory`` logs what each phase's graphs will take (``estimate_capture_memory()``)
before capturing them. It is opt-in because the estimate captures a few probe graphs of its own (0.3-0.7 s a phase
on a GPU); a phase with a memory budget estimates anyway, and every capture's log line shows the estimate when one
was made.

``--tp-size N`` (or vLLM's ``--tensor-parallel-size N``) shards the model over N ranks: the command starts N
processes itself (one GPU each on CUDA, gloo on CPU), or, started by ``torchrun``, runs as the rank it was given.
Rank 0 drives the batch loop and prints the result; a rank that fails stops the others with one error. With a MoE
model, ``--moe-a2a-backend all_to_all`` (or vLLM's ``--all2all-backend all_to_all``) sends each rank's share of the
tokens to the ranks holding their experts and back, instead of all-reducing every rank's partial sums (``none``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

import torch

from cudagraph.config import Backend, ConfigError, CudaGraphConfig, Environment, Phase, add_cli_args, resolve
from cudagraph.runner import ReplayMetrics

from .attention import ATTENTION_BACKEND_CHOICES, AttentionBackendError, AttentionBackendUnavailableError
from .backend_checks import BackendChoices, check_backend_choices
from .batch import SamplingParams
from .cli_values import positive_int
from .config_lines import held_config_lines
from .distributed import (
    ALL_REDUCE_CHOICES,
    DEFAULT_TIMEOUT_S,
    DrivingModelRunner,
    GroupOptions,
    RankFailedError,
    StepBroadcaster,
    TensorParallelGroup,
    follow,
    init_tensor_parallel,
    launch,
    shutdown_tensor_parallel,
    torchrun_rank,
)
from .eagle_cli import build_eagle_drafter, eagle_draft_problem, eagle_source, eagle_target_options
from .generate import Scheduler, StepPolicy
from .kernels import KERNEL_BACKEND_CHOICES, KernelBackendError
from .kv_cache import MAX_PAGE_SIZE, check_page_size
from .lora import LoraError
from .lora_cli import add_lora_args, load_planned_adapters, with_lora_plan
from .model import (
    EAGLE_PRESETS,
    MOE_A2A_BACKENDS,
    PRESETS,
    SINGLE_RANK,
    CausalLM,
    ModelConfig,
    ModelLoadError,
    ShardPlan,
    load_model,
    model_config_from_preset,
    random_model,
)
from .model_runner import CacheConfig, ModelRunner
from .speculative import Drafter, DraftModelDrafter, EagleDrafter, NgramDrafter
from .speed import SpeedReport, engine_speed
from .variants import explain_variants, graph_variants, planned_variants, variants_line

logger = logging.getLogger("cudagraph.engine")

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
EXIT_USAGE = 2
"""Bad input (an option, a model directory, a prompt): one line on stderr, no traceback (``--debug`` shows it)."""
LOG_FORMAT = "[%(asctime)s] %(levelname)s %(name)s: %(message)s"
"""One format, with timestamps, for every cudagraph logger."""
DEFAULT_MAX_CONTEXT_LEN = CacheConfig.max_context_len
"""``--max-context-len`` when not given and the model has more positions than this (the KV cache's own default)."""
DEFAULT_METRICS_PATH = Path("cuda_graph_metrics.json")
"""Where ``--cuda-graph-metrics`` without a path writes its JSON (relative to the working directory)."""


class EngineInputError(ValueError):
    """Input the engine cannot run with, found before any work: the message says what and what is allowed."""


EXPECTED_ERRORS: tuple[type[Exception], ...] = (
    EngineInputError,
    ModelLoadError,
    ConfigError,
    AttentionBackendError,
    AttentionBackendUnavailableError,
    KernelBackendError,
    RankFailedError,
    LoraError,
)
"""Errors that are the user's input, reported in one line; anything else is a bug and keeps its traceback."""


class _OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the problem (``--help`` shows the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


TOKEN_IDS_ALLOWED = "allowed: non-negative integers separated by commas, e.g. 1,2,3"
"""What ``--prompt-token-ids`` takes, as each of its errors says."""


def _token_id_problem(item: str) -> str | None:
    # One item of a token list: what is wrong with it, or None.
    if not item.strip():
        return "is empty"
    try:
        value = int(item)
    except ValueError:
        return f"{item.strip()!r} is not an integer"
    return f"{value} is negative" if value < 0 else None


def token_ids(text: str) -> list[int]:
    """Parse ``1,2,3`` into token ids (argparse type). The error names the first bad item by its position: an empty
    item (``1,,2``, ``1,2,``), one that is not an integer, or a negative one."""
    items = text.split(",")
    for position, item in enumerate(items, start=1):
        problem = _token_id_problem(item)
        if problem is not None:
            where = f"item {position} of {len(items)}" if len(items) > 1 else "the only item"
            raise argparse.ArgumentTypeError(f"{text!r}: {where} {problem}; {TOKEN_IDS_ALLOWED}")
    return [int(item) for item in items]


def temperature(text: str) -> float:
    """Parse ``--temperature`` (argparse type): 0 (greedy) or a positive finite number."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a temperature; allowed: 0 (greedy) or a positive number, e.g. 0.7"
        )
    return value


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
    parser.add_argument(
        "--attention-backend",
        choices=ATTENTION_BACKEND_CHOICES,
        default="auto",
        help="attention over the paged KV cache (auto: triton on CUDA with Triton and a power-of-two head_dim, then "
        "flashinfer when installed and the model runs in float16/bfloat16, else torch; it logs which it took and why)",
    )
    parser.add_argument(
        "--kernel-backend",
        choices=KERNEL_BACKEND_CHOICES,
        default="auto",
        help="the layers' norm/rotary/activation/projection kernels (auto: triton on CUDA, tc_piecewise included, "
        "then flashinfer when installed and the model runs in float16/bfloat16 without tc_piecewise, else torch)",
    )
    parser.add_argument("--max-num-reqs", type=positive_int, default=64, help="request rows in the KV cache")
    parser.add_argument(
        "--max-context-len",
        type=positive_int,
        default=None,
        help="tokens per request in the KV cache, at most the model's max_position_embeddings (default: the smaller "
        f"of max_position_embeddings and {DEFAULT_MAX_CONTEXT_LEN})",
    )
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
    parallel = parser.add_argument_group("tensor parallel")
    parallel.add_argument("--tp-size", type=int, default=None, help="shard the model over N ranks (default 1)")
    parallel.add_argument(
        "--tensor-parallel-size", type=int, default=None, help="vLLM's spelling of --tp-size (they must agree)"
    )
    parallel.add_argument(
        "--tp-all-reduce",
        choices=ALL_REDUCE_CHOICES,
        default="auto",
        help="how small all-reduces travel: symmetric-memory one-shot where available (auto), or always the "
        "process group (NCCL/gloo)",
    )
    parallel.add_argument(
        "--moe-a2a-backend",
        "--all2all-backend",
        dest="moe_a2a_backend",
        choices=MOE_A2A_BACKENDS,
        default="none",
        help="how sparse experts split over ranks meet their tokens: every rank computes its experts for every token "
        "and one all-reduce sums the parts (none), or each rank's tokens go to the experts' ranks and back "
        "(all_to_all; needs a MoE model and --tp-size 2 or more). --all2all-backend is vLLM's spelling",
    )
    parallel.add_argument(
        "--dist-timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds a rank waits on the others (collectives, barriers, teardown) before failing",
    )
    add_cli_args(parser)


def build_parser() -> argparse.ArgumentParser:
    """The ``cudagraph-engine`` argument parser (``generate``)."""
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
    gen.add_argument("--max-new-tokens", type=positive_int, default=16, help="tokens to generate per prompt (>= 1)")
    gen.add_argument("--temperature", type=temperature, default=0.0, help="0 (default) is greedy, else > 0")
    gen.add_argument("--seed", type=int, default=0, help="sampling seed (with --temperature)")
    gen.add_argument("--json", action="store_true", help="print only the JSON result on stdout")
    gen.add_argument(
        "--cuda-graph-metrics",
        nargs="?",
        type=Path,
        const=DEFAULT_METRICS_PATH,
        default=None,
        metavar="PATH",
        help="at exit, print each phase's CUDA-graph replay metrics (replays per bucket, eager steps by reason) to "
        f"stderr and write them as JSON to PATH (default {DEFAULT_METRICS_PATH})",
    )
    steps = gen.add_argument_group("step kinds")
    step_kind = steps.add_mutually_exclusive_group()
    step_kind.add_argument(
        "--speculative-tokens",
        type=positive_int,
        default=None,
        metavar="K",
        help="greedy speculative decoding: draft K tokens per request (--speculative-draft), verify them in one step "
        "(graphed by the decode phase's backend, K + 1 tokens a request); temperature 0 only",
    )
    steps.add_argument(
        "--speculative-draft",
        default=None,
        metavar="SOURCE",
        help="what drafts, with --speculative-tokens: 'ngram' (default: lookup in the request's own text), a preset "
        f"({', '.join(sorted(PRESETS))}; random weights from --model-seed) or a model directory of the target's "
        "vocabulary, run in an engine of its own with its own graphs; or an EAGLE head over the target's hidden "
        f"states, 'eagle:PRESET' ({', '.join(EAGLE_PRESETS)}) or 'eagle:DIR', its k draft steps and its draft "
        "extend each one graph",
    )
    step_kind.add_argument(
        "--mixed-steps",
        action="store_true",
        help="chunked prefill mixed with running decodes in one extend step (graphed by the prefill phase's backend)",
    )
    gen.add_argument(
        "--estimate-cuda-graph-memory",
        action="store_true",
        help="log what each phase's CUDA graphs will take before capturing them (a few probe captures per phase; "
        "a phase with a memory budget estimates anyway)",
    )
    gen.add_argument(
        "--explain",
        action="store_true",
        help="print to stderr where every CUDA-graph setting came from before the run, and after it each phase's "
        "graph variants (plain, lora) with the steps that replayed each and those that ran eagerly",
    )
    add_lora_args(gen)
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


def tp_size_of(args: argparse.Namespace) -> int:
    """The tensor-parallel size from ``--tp-size`` / ``--tensor-parallel-size`` (1 when neither is given)."""
    sglang, vllm = args.tp_size, args.tensor_parallel_size
    if sglang is not None and vllm is not None and sglang != vllm:
        raise EngineInputError(
            f"--tp-size {sglang} and --tensor-parallel-size {vllm} disagree: they are one setting, give one of them"
        )
    size = sglang if sglang is not None else vllm if vllm is not None else 1
    flag = "--tp-size" if sglang is not None else "--tensor-parallel-size"
    if size < 1:
        raise EngineInputError(f"{flag} {size}: the tensor-parallel size must be at least 1")
    return int(size)


def model_config_of(args: argparse.Namespace) -> ModelConfig:
    """The config of the model ``--model`` or ``--preset`` names (``config.json`` only, no weights)."""
    if args.model is not None:
        return ModelConfig.from_pretrained(args.model)
    return model_config_from_preset(args.preset)


def check_tp_size(args: argparse.Namespace, size: int, device: torch.device) -> None:
    """``size`` ranks must fit the devices (one GPU each on CUDA) and split the model's heads and MLP."""
    if device.type == "cuda" and size > torch.cuda.device_count():
        raise EngineInputError(
            f"--tp-size {size} needs {size} GPUs (one per rank) but {torch.cuda.device_count()} are visible"
        )
    check_lora_on_one_rank(args, size)
    ShardPlan(rank=0, size=size, group_name="tp", moe_a2a_backend=args.moe_a2a_backend).check(model_config_of(args))


def check_moe_a2a_backend(args: argparse.Namespace, model: ModelConfig, size: int) -> None:
    """``--moe-a2a-backend all_to_all`` exchanges tokens between ranks' experts: it needs experts to exchange with
    and a second rank (refused rather than ignored, so a command line never claims a path that does not run)."""
    if args.moe_a2a_backend == "none":
        return
    if not model.has_experts:
        raise EngineInputError(
            f"--moe-a2a-backend {args.moe_a2a_backend}: the model has no sparse experts (a dense MLP); allowed: "
            "--moe-a2a-backend none, or a MoE model (Qwen3-MoE, Mixtral)"
        )
    if size < 2:
        raise EngineInputError(
            f"--moe-a2a-backend {args.moe_a2a_backend} sends tokens between the ranks holding the experts, and "
            "--tp-size is 1 (one rank holds every expert); allowed: --tp-size 2 or more, or --moe-a2a-backend none"
        )


def check_lora_on_one_rank(args: argparse.Namespace, size: int) -> None:
    """LoRA adapters (``args.lora_plan``) are served on one rank only: a tensor-parallel shard has no slots yet."""
    if size > 1 and getattr(args, "lora_plan", None) is not None:
        raise EngineInputError(
            f"--tp-size {size} with LoRA adapters: a tensor-parallel shard cannot serve adapters yet; allowed: LoRA "
            "on one rank (--tp-size 1), or --tp-size without --enable-lora and --lora-modules"
        )


NGRAM_DRAFT = "ngram"
"""``--speculative-draft``'s default: drafts by n-gram lookup in the request's own text."""


def check_step_kinds(args: argparse.Namespace) -> None:
    """Speculative decoding here is greedy, with a draft source that exists and speaks the target's vocabulary (a
    draft model on one process; the n-gram drafter at any ``--tp-size``): one error naming the flag that
    conflicts."""
    if args.speculative_tokens is None:
        if args.speculative_draft is not None:
            raise EngineInputError("--speculative-draft says what drafts; add --speculative-tokens K to speculate")
        return
    if args.temperature > 0:
        raise EngineInputError(
            f"--speculative-tokens verifies drafts greedily; --temperature {args.temperature} samples: use "
            "--temperature 0, or drop --speculative-tokens"
        )
    draft = args.speculative_draft or NGRAM_DRAFT
    if draft == NGRAM_DRAFT:
        return
    head = eagle_source(draft)
    if head is not None:
        problem = eagle_draft_problem(head, model_config_of(args), tp_size_of(args))
        if problem is not None:
            raise EngineInputError(problem)
        return
    if tp_size_of(args) > 1:
        # The n-gram drafter is host work on rank 0; a draft model would need shards and collectives of its own.
        raise EngineInputError(
            f"--speculative-draft {draft}: a draft model runs on one process; with --tp-size use the n-gram drafter "
            f"(--speculative-draft {NGRAM_DRAFT}, the default)"
        )
    draft_vocab = draft_model_config(draft).vocab_size
    target_vocab = model_config_of(args).vocab_size
    if draft_vocab != target_vocab:
        raise EngineInputError(
            f"--speculative-draft {draft}: its vocabulary has {draft_vocab} tokens and the target's {target_vocab}; "
            "a draft model must share the target's tokenizer"
        )


def draft_model_config(draft: str) -> ModelConfig:
    """The config of the ``--speculative-draft`` model: a preset, or a directory holding ``config.json``."""
    if draft in PRESETS:
        return model_config_from_preset(draft)
    if not (Path(draft) / "config.json").is_file():
        raise EngineInputError(
            f"--speculative-draft {draft}: not {NGRAM_DRAFT!r}, a preset ({', '.join(sorted(PRESETS))}), a model "
            "directory with a config.json, or an EAGLE head (eagle:PRESET or eagle:DIR)"
        )
    return ModelConfig.from_pretrained(Path(draft))


def build_drafter(
    args: argparse.Namespace, config: CudaGraphConfig, target: ModelRunner | None = None
) -> Drafter | None:
    """The drafter ``--speculative-tokens`` and ``--speculative-draft`` ask for (``None``: no speculation). A draft
    model gets an engine of its own (``build_model_runner``), with the target's device, cache sizes, kernels and
    graphs; an EAGLE head (``eagle:``) drafts beside ``target`` (built with ``eagle_target_options``)."""
    if args.speculative_tokens is None:
        return None
    draft = args.speculative_draft or NGRAM_DRAFT
    if draft == NGRAM_DRAFT:
        return NgramDrafter(args.speculative_tokens)
    head = eagle_source(draft)
    if head is not None:
        if target is None:
            raise EngineInputError(f"--speculative-draft {draft}: an EAGLE head needs the target's model runner")
        return build_eagle_drafter(args, target, head)
    draft_runner = build_model_runner(args, config, model_source=draft if draft in PRESETS else Path(draft))
    return DraftModelDrafter(draft_runner, args.speculative_tokens)


def with_model_defaults(args: argparse.Namespace, model: ModelConfig) -> argparse.Namespace:
    """``args`` with the defaults that depend on the model filled in: ``--max-context-len``, when not given, is the
    smaller of the model's ``max_position_embeddings`` and ``DEFAULT_MAX_CONTEXT_LEN``. ``args`` is not changed."""
    if args.max_context_len is not None:
        return args
    settled = argparse.Namespace(**vars(args))
    settled.max_context_len = min(model.max_position_embeddings, DEFAULT_MAX_CONTEXT_LEN)
    return settled


def prompts_fit_problem(args: argparse.Namespace, model: ModelConfig | None = None) -> str | None:
    """Why a prompt plus its new tokens (and, speculating, the last step's drafts) does not fit a request's KV cache
    rows (``--max-context-len``), or ``None``. With ``model``, the advice never asks for more than its positions."""
    lookahead = getattr(args, "speculative_tokens", None) or 0
    for index, prompt in enumerate(args.prompt_token_ids):
        needed = len(prompt) + args.max_new_tokens + lookahead
        if needed <= args.max_context_len:
            continue
        asked = (
            f"prompt {index} has {len(prompt)} tokens and asks for {args.max_new_tokens} more"
            + (f" with {lookahead} drafts past them" if lookahead else "")
            + f", {needed} in all, "
        )
        if model is not None and args.max_context_len >= model.max_position_embeddings:
            return asked + (
                f"but the model has {model.max_position_embeddings} positions (max_position_embeddings), the most a "
                "request can hold: shorten the prompt or lower --max-new-tokens"
            )
        most = f" (up to {model.max_position_embeddings}, the model's positions)" if model is not None else ""
        return asked + (
            f"but the KV cache holds {args.max_context_len} per request: raise --max-context-len{most} or shorten it"
        )
    return None


def check_prompts_fit(args: argparse.Namespace, model: ModelConfig | None = None) -> None:
    """Raise ``EngineInputError`` when ``prompts_fit_problem`` finds a prompt that does not fit."""
    problem = prompts_fit_problem(args, model)
    if problem is not None:
        raise EngineInputError(problem)


@dataclass(frozen=True)
class ModelCheck:
    """One check of the arguments against the model's config: ``problem`` says what is wrong and what is allowed,
    or returns ``None``; it runs for the commands named in ``commands``."""

    commands: frozenset[str]
    problem: Callable[[argparse.Namespace, ModelConfig], str | None]


def _context_beyond_positions(args: argparse.Namespace, model: ModelConfig) -> str | None:
    # A position past the rotary table has no embedding: caught here rather than as an IndexError mid-generation.
    if args.max_context_len <= model.max_position_embeddings:
        return None
    return (
        f"--max-context-len {args.max_context_len} exceeds the model's max_position_embeddings "
        f"{model.max_position_embeddings}; allowed: --max-context-len {model.max_position_embeddings} or less"
    )


def _token_ids_beyond_vocabulary(args: argparse.Namespace, model: ModelConfig) -> str | None:
    for index, prompt in enumerate(args.prompt_token_ids):
        outside = [token for token in prompt if token >= model.vocab_size]
        if outside:
            return (
                f"prompt {index} has token id {outside[0]}, outside the model's vocabulary of {model.vocab_size} "
                f"tokens; allowed token ids: 0 to {model.vocab_size - 1}"
            )
    return None


MODEL_CHECKS: tuple[ModelCheck, ...] = (
    ModelCheck(frozenset({"generate"}), _context_beyond_positions),
    ModelCheck(frozenset({"generate"}), prompts_fit_problem),
    ModelCheck(frozenset({"generate"}), _token_ids_beyond_vocabulary),
)
"""What the arguments must agree on with the model, checked before any weight is loaded."""


def check_against_model(args: argparse.Namespace, model: ModelConfig) -> None:
    """Raise ``EngineInputError`` for the first of ``MODEL_CHECKS`` that ``args`` fail against ``model``."""
    for check in MODEL_CHECKS:
        problem = check.problem(args, model) if args.command in check.commands else None
        if problem is not None:
            raise EngineInputError(problem)


def backend_choices_of(args: argparse.Namespace, tp_size: int = 1) -> BackendChoices:
    """The backend choices ``args`` make (``--attention-backend``, ``--kernel-backend``, ``--dtype``, speculation)."""
    return BackendChoices(
        attention=args.attention_backend,
        kernels=args.kernel_backend,
        dtype=args.dtype,
        tp_size=tp_size,
        speculates=getattr(args, "speculative_tokens", None) is not None,
    )


def environment_of(device: torch.device) -> Environment:
    """What ``resolve`` needs to know about ``device`` (its compatibility rules turn graphs off off CUDA)."""
    memory_gib = None
    if device.type == "cuda":
        memory_gib = torch.cuda.get_device_properties(device).total_memory / 2**30
    # Environment.lora stays off with adapters: its rule turns prefill graphs off for engines whose prefill cannot
    # follow adapters per request; this one keeps a LoRA variant per phase that reads them from an index buffer.
    return Environment(device_type=device.type, gpu_memory_gib=memory_gib)


def load_engine_model(
    args: argparse.Namespace,
    device: torch.device,
    shard: ShardPlan = SINGLE_RANK,
    source: str | Path | None = None,
) -> CausalLM:
    """The model ``source`` names (a preset name, or a model directory; default: ``--model`` or ``--preset``),
    ``shard``'s part of it, on ``device`` in ``--dtype``; a preset's random weights come from ``--model-seed``."""
    if source is None:
        source = args.model if args.model is not None else args.preset
    if isinstance(source, str) and source in PRESETS:
        config = model_config_from_preset(source)
        return random_model(config, seed=args.model_seed, dtype=args.dtype, device=device, shard=shard)
    return load_model(Path(source), dtype=args.dtype, device=device, shard=shard)


def build_model_runner(
    args: argparse.Namespace,
    config: CudaGraphConfig,
    *,
    capture: bool = True,
    group: TensorParallelGroup | None = None,
    runner_type: type[ModelRunner] = ModelRunner,
    model_source: str | Path | None = None,
    **runner_options: Any,
) -> ModelRunner:
    """Model, KV cache and attention backend from the arguments; with ``capture``, the graphs ``config`` allows.
    ``model_source`` loads another model than ``--model``/``--preset`` (``load_engine_model``: a draft model).

    On a tensor-parallel rank (``group``) the model is the rank's shard, the all-reduce path is chosen (sized for
    the largest decode batch), the group's collectives are warmed up for the largest step (their buffers set up
    once, before any capture), and graphs are captured in lock-step with the other ranks, sharing every capture
    decision."""
    device = group.device if group is not None else _device(args)
    shard = group.shard_plan(args.moe_a2a_backend) if group is not None else SINGLE_RANK
    model = load_engine_model(args, device, shard, source=model_source)
    if group is not None:
        largest_batch = max(config.decode.max_size, 1)
        hidden = model.config.hidden_size
        group.choose_all_reduce(args.tp_all_reduce, model.dtype, largest_batch * hidden)
        # NCCL's buffers for every message size a step sends, set up once now rather than by the first capture.
        largest_tokens = max(config.decode.max_size, config.prefill.max_size, 1)
        group.warm_collectives(model.dtype, largest_tokens * hidden, all_to_all=shard.dispatches_experts)
    cache = CacheConfig(max_num_reqs=args.max_num_reqs, max_context_len=args.max_context_len, page_size=args.page_size)
    runner = runner_type(
        model,
        config,
        cache_config=cache,
        attention_backend=args.attention_backend,
        kernel_backend=args.kernel_backend,
        show_progress=not args.quiet and (group is None or group.rank == 0),
        capture_barrier=group.capture_barrier if group is not None else None,
        **runner_options,
    )
    if capture:
        runner.init_cuda_graphs()
    return runner


def run_generate(
    args: argparse.Namespace, config: CudaGraphConfig, group: TensorParallelGroup | None = None
) -> dict[str, Any] | None:
    """Generate for every prompt; the JSON-ready result. On a tensor-parallel group rank 0 schedules and sends
    every step, the other ranks follow (and return ``None``)."""
    check_prompts_fit(args)
    # Every rank estimates or none does: the probe captures run the forward and its collectives, as capture does.
    estimate: dict[str, Any] = {"log_capture_estimate": args.estimate_cuda_graph_memory}
    if group is None:  # an EAGLE head reads the target's hidden states (one process only: check_step_kinds)
        estimate.update(eagle_target_options(args))
    if group is not None and group.rank != 0:
        follower = build_model_runner(args, config, group=group, **estimate)
        try:
            if args.speculative_tokens is not None:
                # Rank 0's verify steps replay verify graphs: every rank captures them, at the same point.
                follower.check_verify_support()
                if follower.decode_cuda_graph_runner is not None:
                    follower.init_verify_cuda_graph(args.speculative_tokens + 1)
            follow(follower, StepBroadcaster(group))
        finally:
            follower.shutdown()
        return None
    broadcaster = StepBroadcaster(group) if group is not None else None
    plan = getattr(args, "lora_plan", None)  # never on a group: check_tp_size refuses LoRA there
    if broadcaster is not None:
        model_runner = build_model_runner(
            args, config, group=group, runner_type=DrivingModelRunner, broadcaster=broadcaster, **estimate
        )
    elif plan is None:
        model_runner = build_model_runner(args, config, **estimate)
    else:
        model_runner = build_model_runner(args, config, capture=False, lora_config=plan.config, **estimate)
        load_planned_adapters(model_runner, plan)  # before capture: an adapter that does not fit fails first
        model_runner.init_cuda_graphs()
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed)
    per_prompt = [replace(params, lora_name=name) for name in plan.prompt_adapters] if plan is not None else params
    drafter: Drafter | None = None
    try:
        if args.speculative_tokens is not None:
            model_runner.check_verify_support()
            drafter = build_drafter(args, config, model_runner)
            if model_runner.decode_cuda_graph_runner is not None:
                model_runner.init_verify_cuda_graph(args.speculative_tokens + 1)
        scheduler = Scheduler(model_runner, policy=StepPolicy(mixed=args.mixed_steps, drafter=drafter))
        outputs = scheduler.run(args.prompt_token_ids, per_prompt)
        speed: SpeedReport = engine_speed(model_runner, args.prompt_token_ids, outputs, scheduler.stats)
        variants = graph_variants(model_runner)  # before shutdown, which drops the runners
    finally:
        if broadcaster is not None:
            broadcaster.stop()
        model_runner.shutdown()
        if isinstance(drafter, DraftModelDrafter | EagleDrafter):
            drafter.model_runner.shutdown()
    if args.cuda_graph_metrics is not None:
        metrics = dict(model_runner.cuda_graph_metrics)
        lora = model_runner.lora_cuda_graph_metrics if model_runner.lora is not None else None
        drafts = (
            (drafter.model_runner.draft_metrics, drafter.model_runner.draft_extend_metrics)
            if isinstance(drafter, EagleDrafter)
            else ()
        )
        report_cuda_graph_metrics(
            metrics, args.cuda_graph_metrics, verify=model_runner.verify_cuda_graph_metrics, lora=lora, drafts=drafts
        )
    logger.info("%s", speed.line())
    logger.info("%s", variants_line(variants))
    if args.explain:
        print(explain_variants(variants, after_run=True), file=sys.stderr)
    return {
        "outputs": [{"output_token_ids": output.output_token_ids} for output in outputs],
        "speed": speed.to_dict(),
        "graph_variants": [variant.to_dict() for variant in variants],
    }


def report_cuda_graph_metrics(
    metrics: Mapping[Phase, ReplayMetrics],
    path: Path,
    verify: ReplayMetrics | None = None,
    lora: Mapping[Phase, ReplayMetrics] | None = None,
    drafts: Sequence[ReplayMetrics] = (),
) -> None:
    """End each phase's warning window, print its table to stderr and write every phase's metrics as JSON to
    ``path`` (``{"decode": {...}, "prefill": {...}}``, ``"verify"`` when speculative verify steps ran, with ``lora``
    each phase's LoRA variant as ``"decode lora"`` and ``"prefill lora"``, and each of ``drafts`` that ran, by its
    label: an EAGLE head's ``"draft"`` chains and ``"draft extend"`` steps)."""
    tables = dict(((str(phase), m) for phase, m in metrics.items()))
    if verify is not None and verify.steps:
        tables["verify"] = verify
    for draft_metrics in drafts:
        if draft_metrics.steps:
            tables[draft_metrics.label] = draft_metrics
    for lora_metrics in (lora or {}).values():
        tables[lora_metrics.label] = lora_metrics
    for table_metrics in tables.values():
        table_metrics.close_window()
    print("\n\n".join(table_metrics.table() for table_metrics in tables.values()), file=sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({name: m.to_dict() for name, m in tables.items()}, indent=2) + "\n")
    logger.info("CUDA-graph metrics written to %s", path)


COMMANDS = {"generate": run_generate}
"""Command name -> what runs it (on one process, or on each rank of a tensor-parallel group)."""

MOVED_COMMANDS = {
    "bench": (
        "decode-step timing moved to the benchmark harness, which lives in a source checkout of cudagraph: run "
        "`nox -s bench` (or `python3 bench/run.py`; `python3 bench/bench_engine.py` for the engine's decode steps)"
    ),
}
"""Commands this CLI had and no longer has -> where they went; asking for one is a usage error that says so."""


def _configure_logging(args: argparse.Namespace, rank: int | None = None) -> None:
    # Like SGLang: INFO by default (a capture bar, one summary line per runner), -q for warnings only.
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    log_format = LOG_FORMAT if rank is None else LOG_FORMAT.replace("] ", f"] TP{rank} ", 1)
    logging.basicConfig(level=level, format=log_format, stream=sys.stderr, force=rank is not None)


def _rank_device(args: argparse.Namespace, local_rank: int) -> torch.device:
    """A rank's device: its own GPU (``cuda:<local rank>``) on CUDA, else the CPU."""
    return torch.device("cuda", local_rank) if _device(args).type == "cuda" else torch.device("cpu")


def tensor_parallel_rank(rank: int, world_size: int, init_method: str, payload: Any) -> dict[str, Any] | None:
    """One rank of a ``--tp-size`` command (what ``launch`` runs in each process): join the group, run the
    command, tear down in order; rank 0's result, ``None`` elsewhere."""
    args, local_rank = payload
    _configure_logging(args, rank)
    device = _rank_device(args, rank if local_rank is None else local_rank)
    with held_config_lines() as config_lines:  # the same on every rank: same flags, same device
        config = resolve(args, environment=environment_of(device))
    config_lines.release()
    group = init_tensor_parallel(GroupOptions(rank, world_size, device, init_method, args.dist_timeout))
    try:
        result = COMMANDS[args.command](args, config, group)
    finally:
        # Each command frees its own graphs before returning; this synchronizes, meets the others and destroys.
        shutdown_tensor_parallel(group)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``cudagraph-engine`` and ``python -m cudagraph.engine``."""
    arguments = sys.argv[1:] if argv is None else list(argv)
    if arguments and arguments[0] in MOVED_COMMANDS:
        print(f"cudagraph-engine {arguments[0]}: error: {MOVED_COMMANDS[arguments[0]]}", file=sys.stderr)
        return EXIT_USAGE
    args = build_parser().parse_args(arguments)
    _configure_logging(args)
    try:
        return _run(args)
    except EXPECTED_ERRORS as error:
        if args.debug:
            traceback.print_exc(file=sys.stderr)
        print(f"cudagraph-engine {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE


def _log_graphs_off(config: CudaGraphConfig) -> None:
    """One info line when both phases are off by the user's flags; a compatibility rule (no CUDA device) that turned
    a phase off has already said so, once, under ``cudagraph.config``."""
    if any(config.backend(phase) is not Backend.DISABLED for phase in Phase):
        return
    sources = dict.fromkeys(config.sources.get(f"{phase}.backend", "config") for phase in Phase)
    if not any(source.startswith("rule ") for source in sources):
        logger.info("CUDA graphs are disabled for both phases (%s); every step runs eagerly", ", ".join(sources))


def _run(args: argparse.Namespace) -> int:
    # Input checks come before anything logs, so bad input is the only line on stderr.
    device = _device(args)
    if args.command == "generate":
        check_step_kinds(args)
        args = with_lora_plan(args)
    model = model_config_of(args)
    args = with_model_defaults(args, model)
    check_against_model(args, model)
    tp_size = tp_size_of(args)
    check_lora_on_one_rank(args, tp_size)
    started_by_torchrun = torchrun_rank()
    ranks = started_by_torchrun.world_size if started_by_torchrun is not None else tp_size
    check_moe_a2a_backend(args, model, ranks)
    # What resolve says (rule lines, warnings) waits until every backend choice has passed.
    with held_config_lines() as config_lines:
        config = resolve(args, environment=environment_of(device))
    check_backend_choices(backend_choices_of(args, tp_size), model, device, config)
    config_lines.release()
    _log_graphs_off(config)
    if args.explain:
        plan = args.lora_plan if args.command == "generate" else None
        print(config.explain(), planned_variants(plan.config if plan is not None else None), sep="\n", file=sys.stderr)
    under_torchrun = torchrun_rank()
    if (
        under_torchrun is not None
        and under_torchrun.world_size != tp_size
        and (args.tp_size or args.tensor_parallel_size)
    ):
        raise EngineInputError(
            f"--tp-size {tp_size} but torchrun started {under_torchrun.world_size} processes: they must match"
        )
    result: dict[str, Any] | None
    if under_torchrun is not None and under_torchrun.world_size > 1:
        check_tp_size(args, under_torchrun.world_size, _device(args))
        payload = (args, under_torchrun.local_rank)
        result = tensor_parallel_rank(under_torchrun.rank, under_torchrun.world_size, "env://", payload)
        if result is None:
            return 0  # rank 0 prints
    elif tp_size > 1:
        check_tp_size(args, tp_size, _device(args))
        result = launch(tensor_parallel_rank, (args, None), tp_size, exit_timeout_s=args.dist_timeout)
    else:
        result = COMMANDS[args.command](args, config)
    assert result is not None
    if not args.json:
        for index, output in enumerate(result["outputs"]):
            print(f"prompt {index}: {output['output_token_ids']}")
        return 0
    print(json.dumps(result))
    return 0
