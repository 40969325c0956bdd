"""The rule table: one codemod per module, each with a code, so selection and listing fall out of the table.

Rules run in table order on one parse of the file: imports first, so the later spelling-based rules see the new
module paths.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..renames import RenameKind, RenameTable
from ..spellings import covering_anchors, legacy_spellings
from ..table_cache import per_table
from .attributes import LegacyMembers
from .base import MigrationCommand
from .cli_flags import LegacyCliFlags
from .config_strings import LegacyConfigStrings
from .dotted_strings import LegacyDottedStrings
from .engine_options import LegacyEngineOptions
from .enum_members import LegacyEnumMembers
from .imports import LegacyImports
from .keywords import LegacyKeywords
from .option_fields import LegacyOptionFields

__all__ = ["RULES", "Rule", "RulePrefilter", "RuleSelectionError", "rule_prefilter", "select_rules"]


@dataclass(frozen=True)
class Rule:
    """One codemod: its code (``--select``/``--ignore``), a short name, the row kinds it reads, its command class."""

    code: str
    name: str
    kinds: tuple[RenameKind, ...]
    command: type[MigrationCommand]
    summary: str

    def triggers(self, table: RenameTable) -> frozenset[str]:
        """Text of which at least one must occur in a file for this rule to have anything to do there."""
        return self.command.triggers(table)

    def applies(self, text: str, path: str, table: RenameTable, markers: frozenset[str] = frozenset()) -> bool:
        """Whether this rule could have anything to do in ``text``, the file at ``path`` (a cheap text test)."""
        return self.command.applies(text, path, table, markers)


_RULE_TABLE: tuple[Rule, ...] = (
    Rule(
        "CG101",
        "legacy-imports",
        (RenameKind.MODULE, RenameKind.SYMBOL),
        LegacyImports,
        "imports of legacy modules and symbols, and every use of what they bound",
    ),
    Rule(
        "CG102",
        "legacy-dotted-strings",
        (RenameKind.MODULE, RenameKind.SYMBOL),
        LegacyDottedStrings,
        'dotted legacy paths in strings, e.g. mock.patch("legacy.module.Name")',
    ),
    Rule(
        "CG201",
        "legacy-members",
        (RenameKind.ATTRIBUTE, RenameKind.METHOD),
        LegacyMembers,
        "renamed model-runner and graph-runner attributes and methods",
    ),
    Rule("CG301", "legacy-enum-members", (RenameKind.ENUM_MEMBER,), LegacyEnumMembers, "renamed enum members"),
    Rule("CG302", "legacy-config-strings", (RenameKind.CONFIG_STRING,), LegacyConfigStrings, "legacy config values"),
    Rule("CG401", "legacy-keywords", (RenameKind.KWARG,), LegacyKeywords, "legacy server-argument keywords in calls"),
    Rule("CG402", "legacy-cli-flags", (RenameKind.CLI_FLAG,), LegacyCliFlags, "legacy flags in argument lists"),
    Rule(
        "CG403",
        "legacy-engine-options",
        (RenameKind.KWARG,),
        LegacyEngineOptions,
        "legacy options passed to or read from another engine's API (ServerArgs, Engine)",
    ),
    Rule(
        "CG404",
        "legacy-option-fields",
        (RenameKind.KWARG,),
        LegacyOptionFields,
        "config-class fields named like a legacy engine's options, in files that import it (listed for review)",
    ),
)


for _rule in _RULE_TABLE:
    _rule.command.CODE = _rule.code
RULES: tuple[Rule, ...] = _RULE_TABLE
"""Every rule, in the order they run on a file."""


class RuleSelectionError(ValueError):
    """A ``--select``/``--ignore`` entry matched no rule."""


def select_rules(select: Iterable[str] = (), ignore: Iterable[str] = (), rules: Sequence[Rule] = RULES) -> list[Rule]:
    """The rules chosen by code prefixes or names (``CG1`` picks a group), in table order.

    ``select`` empty means all rules; ``ignore`` then removes. Every entry must match at least one rule.
    """
    select, ignore = list(select), list(ignore)
    chosen = [rule for rule in rules if not select or any(_matches(rule, entry) for entry in select)]
    for entry in [*select, *ignore]:
        if not any(_matches(rule, entry) for rule in rules):
            known = ", ".join(f"{rule.code} ({rule.name})" for rule in rules)
            raise RuleSelectionError(f"no rule matches {entry!r}; rules are: {known}; a code prefix such as CG1 works")
    return [rule for rule in chosen if not any(_matches(rule, entry) for entry in ignore)]


def _matches(rule: Rule, entry: str) -> bool:
    entry = entry.strip()
    return bool(entry) and (rule.code.upper().startswith(entry.upper()) or rule.name == entry)


@dataclass(frozen=True)
class RulePrefilter:
    """The first test every file meets: a file that holds none of :attr:`anchors` is one no rule applies to, and no
    rule's own test (:meth:`Rule.applies`, a few hundred substring searches) runs on it.

    The anchors are a few substrings such that every text a rule's test looks for (its
    :meth:`~cudagraph.migrate.rules.base.MigrationCommand.prefilter_texts`), and every legacy spelling of the table,
    contains one: a file holding any of those holds an anchor, so the prefilter never drops a file a rule would
    have read (``tests/codemods/test_prefilter_property.py`` checks it).
    """

    anchors: tuple[str, ...]

    def keeps(self, text: str) -> bool:
        """Whether ``text`` may hold something a rule looks for (False: certainly not)."""
        return any(anchor in text for anchor in self.anchors)

    def active(
        self, rules: Sequence[Rule], text: str, path: str, table: RenameTable, markers: frozenset[str]
    ) -> list[Rule]:
        """The rules of ``rules`` that apply to ``text``, the file at ``path``."""
        if not self.keeps(text):
            return []
        return [rule for rule in rules if rule.applies(text, path, table, markers)]


@per_table
def rule_prefilter(rules: tuple[Rule, ...], table: RenameTable) -> RulePrefilter:
    """The prefilter of ``rules`` (see :class:`RulePrefilter`), computed once per rule selection and table."""
    texts = {text for rule in rules for text in rule.command.prefilter_texts(table)}
    texts.update(spelling.text for spelling in legacy_spellings(table))
    return RulePrefilter(covering_anchors(tuple(sorted(texts))))
