"""Argparse value types the engine's command-line modules share (``commands``, ``lora_cli``)."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """Parse a count that must be at least 1 (argparse type: ``--max-new-tokens``, ``--max-loras``...)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer; allowed: 1, 2, 3, ...")
    return value
