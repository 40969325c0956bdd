"""``generate --speculative-draft eagle:DIR|PRESET``: EAGLE drafting from the command line.

``eagle:`` names the head: a preset of ``model.eagle.EAGLE_PRESETS`` (``random``: seeded from ``--model-seed``;
``self``: the one-layer target itself, every draft accepted) or a head directory (``config.json`` and
``model.safetensors``, ``model.eagle``'s layout). The target then keeps its hidden states for the head
(``keep_hidden_states``), and the head gets its draft graphs beside the target's (the decode phase's backend,
buckets and pool).

Example::

    cudagraph-engine generate --preset tiny-qwen3-random --prompt-token-ids 1,2,3 \\
        --speculative-tokens 3 --speculative-draft eagle:random
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .eagle import EagleModelRunner
from .model import ModelConfig
from .model.architecture import CONFIG_FILE
from .model.checkpoint import SINGLE_FILE
from .model.eagle import EAGLE_PRESETS, eagle_head_from_source
from .model_runner import ModelRunner
from .speculative import EagleDrafter

EAGLE_PREFIX = "eagle:"
"""How ``--speculative-draft`` names an EAGLE head."""


def eagle_source(draft: str | None) -> str | None:
    """The head ``--speculative-draft`` names after ``eagle:`` (``None``: not an EAGLE draft)."""
    if draft is None or not draft.startswith(EAGLE_PREFIX):
        return None
    return draft[len(EAGLE_PREFIX) :]


def eagle_draft_problem(source: str, target: ModelConfig, tp_size: int) -> str | None:
    """What is wrong with ``--speculative-draft eagle:SOURCE`` for a ``target`` served at ``tp_size``, and what is
    allowed, in one sentence; ``None`` when nothing is."""
    flag = f"--speculative-draft {EAGLE_PREFIX}{source}"
    allowed = f"allowed: {EAGLE_PREFIX}PRESET ({', '.join(EAGLE_PRESETS)}) or {EAGLE_PREFIX}DIR (a head directory)"
    if tp_size > 1:
        return f"{flag}: an EAGLE head drafts on one process; with --tp-size use the n-gram drafter"
    if source == "self" and target.num_layers != 1:
        return (
            f"{flag}: the self-draft head copies a one-layer target; this target has {target.num_layers} layers "
            f"(use a one-layer model, or {EAGLE_PREFIX}random)"
        )
    if source in EAGLE_PRESETS:
        return None
    directory = Path(source)
    if not source or not (directory / CONFIG_FILE).is_file() or not (directory / SINGLE_FILE).is_file():
        return f"{flag}: not an EAGLE preset nor a directory holding {CONFIG_FILE} and {SINGLE_FILE}; {allowed}"
    head = ModelConfig.from_pretrained(directory)
    for name in ("hidden_size", "vocab_size"):
        if getattr(head, name) != getattr(target, name):
            return (
                f"{flag}: the head's {name} is {getattr(head, name)} and the target's {getattr(target, name)}; an "
                "EAGLE head drafts for a target of its own width and vocabulary"
            )
    return None


def eagle_target_options(args: argparse.Namespace) -> dict[str, Any]:
    """The target ``ModelRunner``'s options an EAGLE draft needs: its hidden states kept for ``k + 1`` tokens a
    request (none without one)."""
    if args.speculative_tokens is None or eagle_source(args.speculative_draft) is None:
        return {}
    return {"keep_hidden_states": args.speculative_tokens + 1}


def build_eagle_drafter(args: argparse.Namespace, target: ModelRunner, source: str) -> EagleDrafter:
    """The head ``source`` names over ``target``, its runner and its graphs (where the decode phase is graphed)."""
    head = eagle_head_from_source(source, target.model, seed=args.model_seed)  # type: ignore[arg-type]
    runner = EagleModelRunner(target, head, args.speculative_tokens, show_progress=not args.quiet)
    runner.init_cuda_graphs()
    return EagleDrafter(runner)
