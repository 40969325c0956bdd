"""Where the lines of one version of a file went in another: the findings a rule reports name lines of the file as
the user has it, while the rules read trees that earlier rules (or the run's own writing) have moved lines in."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

__all__ = ["moved_lines"]


def moved_lines(before: Sequence[str], after: Sequence[str]) -> dict[int, int]:
    """1-based line of ``before`` -> the line of ``after`` that holds the same statement (lines only ``before`` has,
    such as TODO comments the other version lacks, are absent).

    Lines added to a block come first (TODO comments go above their statement), so where a block changed size the
    lines of the shorter side map onto the last lines of the longer one.
    """
    moved: dict[int, int] = {}
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes():
        if tag == "delete":
            continue
        shift = max(j2 - j1 - (i2 - i1), 0)
        for offset in range(i2 - i1):
            moved[i1 + offset + 1] = min(j1 + shift + offset, j2 - 1) + 1
    return moved
