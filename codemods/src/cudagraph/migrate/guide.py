"""``cudagraph-migrate --explain CODE``: a rule's manual steps, from the migration guide shipped with the tool.

Every ``# TODO(cudagraph-migrate)`` comment ends naming this command with the code of the rule that wrote it, as
``ruff rule CODE`` explains a ruff rule. The text comes from ``migration-guide.md`` (``refactor/`` in the source tree),
which the wheel carries as package data, so an installed tool needs no checkout and no network to explain itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .rules import RULES, Rule
from .todo_comments import GuideSection

__all__ = ["PACKAGED_GUIDE_PATH", "RULE_SECTIONS", "GuideNotFoundError", "explain", "guide_path", "manual_steps"]

PACKAGED_GUIDE_PATH = Path(__file__).parent / "data" / "migration-guide.md"
"""Where the wheel ships its copy of the guide (copied there by the sdist, or by ``hatch_build.py``)."""

_CHECKOUT_GUIDE_PATH = Path(__file__).resolve().parents[4] / "refactor" / "migration-guide.md"

RULE_SECTIONS: dict[str, tuple[GuideSection, ...]] = {
    "CG101": (
        GuideSection.SUBCLASSES,
        GuideSection.CALLS,
        GuideSection.SHARED_STATE,
        GuideSection.HANDOFFS,
        GuideSection.PATCHED_CLASSES,
        GuideSection.NAMES_THAT_STAY,
        GuideSection.MODULE_OBJECTS,
        GuideSection.STAR_IMPORTS,
    ),
    "CG102": (GuideSection.MEMBER_STRINGS, GuideSection.HANDOFFS, GuideSection.NAMES_THAT_STAY),
    "CG201": (GuideSection.ENGINE_MEMBERS,),
    "CG301": (),
    "CG302": (),
    "CG401": (GuideSection.RUN_TIME_VALUES,),
    "CG402": (GuideSection.OTHER_ENGINES, GuideSection.FLAG_DEFINITIONS),
    "CG403": (GuideSection.OTHER_ENGINES, GuideSection.RUN_TIME_VALUES),
    "CG404": (GuideSection.OTHER_ENGINES,),
}
"""Per rule code, the guide's "Manual steps" sections its TODOs and review lines point to (a test runs every fixture
and checks that each TODO a rule writes names one of its sections here)."""


class GuideNotFoundError(FileNotFoundError):
    """Neither the packaged guide nor a checkout's is there (a broken install)."""


@dataclass(frozen=True)
class _Section:
    anchor: str
    text: str


def guide_path() -> Path:
    """The guide this installation reads: the wheel's packaged copy, else the source checkout's ``refactor/``."""
    for candidate in (PACKAGED_GUIDE_PATH, _CHECKOUT_GUIDE_PATH):
        if candidate.is_file():
            return candidate
    raise GuideNotFoundError(
        f"migration-guide.md not found: looked for {PACKAGED_GUIDE_PATH} (installed wheel) and {_CHECKOUT_GUIDE_PATH} "
        "(source checkout)"
    )


def manual_steps(guide: str) -> tuple[str, dict[str, str]]:
    """The "Manual steps" part of the guide's markdown: its introduction, and each ``###`` section by anchor."""
    part = guide.split("\n## Manual steps\n", 1)[1].split("\n## ", 1)[0]
    introduction, *sections = re.split(r"^(?=### )", part, flags=re.MULTILINE)
    by_anchor = {}
    for section in sections:
        heading = section.splitlines()[0].removeprefix("### ")
        by_anchor[_anchor(heading)] = section.strip()
    return introduction.strip(), by_anchor


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")


def explain(code: str, guide: str | None = None) -> str:
    """What ``--explain CODE`` prints: the rule's line, then the guide's manual steps for what it leaves to you."""
    rule = _rule(code)
    introduction, sections = manual_steps(guide if guide is not None else guide_path().read_text(encoding="utf-8"))
    lines = [f"{rule.code} {rule.name}: {rule.summary}", ""]
    wanted = RULE_SECTIONS.get(rule.code, ())
    if not wanted:
        lines.append(f"{rule.code} rewrites every place it finds: it leaves no manual step and writes no TODO.")
        return "\n".join(lines) + "\n"
    lines += [introduction, ""]
    for section in wanted:
        lines += [sections[section.value], ""]
    return "\n".join(lines).rstrip() + "\n"


def _rule(code: str) -> Rule:
    for rule in RULES:
        if rule.code.upper() == code.strip().upper() or rule.name == code.strip():
            return rule
    known = ", ".join(rule.code for rule in RULES)
    raise KeyError(f"no rule {code!r}; rules are {known} (cudagraph-migrate --list-rules)")
