"""The LoRA options of ``cudagraph-engine generate``, in the spellings vLLM and SGLang users know, checked before any
model work.

- ``--enable-lora`` (vLLM): serve LoRA adapters; implied by ``--lora-modules``.
- ``--lora-modules NAME=PATH ...`` (vLLM; SGLang's ``--lora-paths NAME=PATH ...`` is the same option): adapters to
  load at start, each a PEFT directory (``adapter_config.json`` + ``adapter_model.safetensors``).
- ``--max-loras N`` (vLLM; SGLang's ``--max-loras-per-batch N``): adapter slots, at least one per adapter given
  (default: that many).
- ``--max-lora-rank R`` (both): the rank the slots and the LoRA graph variants are sized for (default: the adapters'
  largest rank).
- ``--lora-name NAME``: the adapter the prompts go through, once for every prompt or once per ``--prompt-token-ids``
  in order; ``-`` is the base model.

``lora_plan_of`` turns the options into a ``LoraPlan`` (the ``LoraConfig``, every adapter read from its directory,
each prompt's adapter) or one ``LoraError`` naming what was wrong and what is allowed.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .cli_values import positive_int
from .lora import LoraAdapter, LoraConfig, LoraError
from .model_runner import ModelRunner

BASE_MODEL = "-"
"""``--lora-name -``: the prompt runs on the base model, without an adapter."""
DEFAULT_MAX_LORA_RANK = LoraConfig.max_rank
"""``--max-lora-rank`` when no adapter is given to take it from (vLLM's default too)."""
MODULE_ALLOWED = "allowed: NAME=PATH, an adapter name and its PEFT directory, e.g. sql=/adapters/sql"
"""What ``--lora-modules`` takes, as each of its errors says."""


@dataclass(frozen=True)
class LoraModule:
    """One ``--lora-modules`` item: the name requests use, and the PEFT directory it is read from."""

    name: str
    path: Path

    def __str__(self) -> str:
        return f"{self.name}={self.path}"


def lora_module(text: str) -> LoraModule:
    """Parse ``NAME=PATH`` (argparse type of ``--lora-modules`` and ``--lora-paths``)."""
    name, equals, path = text.partition("=")
    name, path = name.strip(), path.strip()
    if not equals or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=PATH; {MODULE_ALLOWED}")
    if name == BASE_MODEL:
        raise argparse.ArgumentTypeError(
            f"{text!r}: {BASE_MODEL!r} names the base model in --lora-name; {MODULE_ALLOWED}"
        )
    return LoraModule(name, Path(path))


def add_lora_args(parser: argparse.ArgumentParser) -> None:
    """The ``LoRA adapters`` option group (see the module docstring for every spelling)."""
    group = parser.add_argument_group("LoRA adapters", "vLLM's and SGLang's spellings; a PEFT directory per adapter")
    group.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters (implied by --lora-modules)")
    for flag, note in (("--lora-modules", ""), ("--lora-paths", " (SGLang's spelling of --lora-modules)")):
        group.add_argument(
            flag,
            dest="lora_modules",
            type=lora_module,
            nargs="+",
            action="extend",
            default=None,
            metavar="NAME=PATH",
            help=f"adapters to load, each NAME=PATH with PATH a PEFT adapter directory{note}",
        )
    group.add_argument(
        "--max-loras", type=positive_int, default=None, metavar="N", help="adapter slots (default: one per adapter)"
    )
    group.add_argument(
        "--max-loras-per-batch",
        type=positive_int,
        default=None,
        metavar="N",
        help="SGLang's spelling of --max-loras (they must agree)",
    )
    group.add_argument(
        "--max-lora-rank",
        type=positive_int,
        default=None,
        metavar="R",
        help="the largest adapter rank; the LoRA graphs are captured at it (default: the adapters' largest rank, "
        f"{DEFAULT_MAX_LORA_RANK} without adapters)",
    )
    group.add_argument(
        "--lora-name",
        action="append",
        default=None,
        metavar="NAME",
        help=f"the adapter the prompts go through: once for every prompt, or once per --prompt-token-ids in order "
        f"({BASE_MODEL!r}: the base model)",
    )


@dataclass(frozen=True)
class LoraPlan:
    """What the LoRA options ask for, checked: the slots' config, the adapters read from their directories (by
    name) and each prompt's adapter (``None``: the base model)."""

    config: LoraConfig
    modules: tuple[LoraModule, ...]
    adapters: Mapping[str, LoraAdapter]
    prompt_adapters: tuple[str | None, ...]


_SIZING_FLAGS = ("max_loras", "max_loras_per_batch", "max_lora_rank", "lora_name")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def lora_plan_of(args: argparse.Namespace) -> LoraPlan | None:
    """The checked ``LoraPlan`` of ``args``, or ``None`` when LoRA is off; ``LoraError`` names the first problem."""
    modules: Sequence[LoraModule] = args.lora_modules or ()
    if not (args.enable_lora or modules):
        given = [dest for dest in _SIZING_FLAGS if getattr(args, dest) is not None]
        if given:
            raise LoraError(
                f"{_flag(given[0])} is a LoRA option but LoRA is off: add --enable-lora, or --lora-modules NAME=PATH"
            )
        return None
    adapters = _read_adapters(modules)
    max_loras = _max_loras(args, len(modules))
    max_rank = _max_rank(args.max_lora_rank, modules, adapters)
    config = LoraConfig(max_loras=max_loras, max_rank=max_rank)
    return LoraPlan(
        config, tuple(modules), adapters, _prompt_adapters(args.lora_name, adapters, len(args.prompt_token_ids))
    )


def _read_adapters(modules: Sequence[LoraModule]) -> dict[str, LoraAdapter]:
    adapters: dict[str, LoraAdapter] = {}
    for module in modules:
        if module.name in adapters:
            raise LoraError(f"--lora-modules names {module.name!r} twice; allowed: one PATH per adapter name")
        try:
            adapters[module.name] = LoraAdapter.from_peft(module.path)
        except (LoraError, json.JSONDecodeError, KeyError, ValueError) as error:
            raise LoraError(f"--lora-modules {module}: {_reason(error)}") from None
    return adapters


def _reason(error: Exception) -> str:
    if isinstance(error, KeyError):
        return f"adapter_config.json has no {error.args[0]!r}, the adapter's rank"
    return str(error)


def _max_loras(args: argparse.Namespace, adapters: int) -> int:
    vllm, sglang = args.max_loras, args.max_loras_per_batch
    if vllm is not None and sglang is not None and vllm != sglang:
        raise LoraError(
            f"--max-loras {vllm} and --max-loras-per-batch {sglang} disagree: they are one setting, give one of them"
        )
    given = vllm if vllm is not None else sglang
    if given is None:
        return max(adapters, 1)
    if given < adapters:
        flag = "--max-loras" if vllm is not None else "--max-loras-per-batch"
        raise LoraError(
            f"{flag} {given} holds {given} adapters at once but --lora-modules names {adapters}, all loaded at start; "
            f"allowed: {flag} {adapters} or more"
        )
    return int(given)


def _max_rank(given: int | None, modules: Sequence[LoraModule], adapters: Mapping[str, LoraAdapter]) -> int:
    if given is None:
        return max((adapter.rank for adapter in adapters.values()), default=DEFAULT_MAX_LORA_RANK)
    for module in modules:
        rank = adapters[module.name].rank
        if rank > given:
            raise LoraError(
                f"--lora-modules {module}: its rank {rank} is above --max-lora-rank {given}; allowed: adapters of "
                f"rank {given} or less, or --max-lora-rank {rank} or more"
            )
    return given


def _prompt_adapters(
    names: Sequence[str] | None, adapters: Mapping[str, LoraAdapter], prompts: int
) -> tuple[str | None, ...]:
    if not names:
        return (None,) * prompts
    if len(names) not in (1, prompts):
        raise LoraError(
            f"--lora-name is given {len(names)} times for {prompts} prompts; allowed: once (every prompt) or once per "
            "--prompt-token-ids, in order"
        )
    for name in names:
        if name != BASE_MODEL and name not in adapters:
            known = ", ".join(adapters) or "none loaded"
            raise LoraError(
                f"--lora-name {name}: no adapter of that name; allowed: the --lora-modules names ({known}) or "
                f"{BASE_MODEL} (the base model)"
            )
    chosen = [None if name == BASE_MODEL else name for name in names]
    return tuple(chosen * prompts if len(chosen) == 1 else chosen)


def with_lora_plan(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with ``lora_plan`` set (``lora_plan_of``: ``None`` when LoRA is off). ``args`` is not changed."""
    settled = argparse.Namespace(**vars(args))
    settled.lora_plan = lora_plan_of(args)
    return settled


def load_planned_adapters(model_runner: ModelRunner, plan: LoraPlan) -> None:
    """Load every adapter of ``plan`` into ``model_runner``'s slots under its name; an adapter that does not fit the
    model (layers, shapes) is one ``LoraError`` naming its ``--lora-modules`` item."""
    for module in plan.modules:
        try:
            model_runner.load_lora_adapter(module.name, plan.adapters[module.name])
        except LoraError as error:
            raise LoraError(f"--lora-modules {module}: {error}") from None
