"""Every spelling a legacy name can take, derived from ``refactor/renames.toml`` alone.

The inventory (:mod:`.inventory`) looks for these in every text file of a tree; nothing here is a second list of
names. Per row kind:

- ``module``: the dotted path (``sglang.srt.model_executor.cuda_graph_runner``);
- ``symbol``: the qualified path (``...cuda_graph_runner.CudaGraphRunner``), and the bare name where the new name
  differs (``CudaGraphRunner`` -> ``DecodeCudaGraphRunner``; a name that moved unchanged is legacy only through its
  module, which the module path accounts for);
- ``attribute``, ``method``, ``enum_member``, ``config_string``: the bare old name;
- ``kwarg``: the option name in its underscore form (``cuda_graph_max_bs``) and its dash form (``cuda-graph-max-bs``,
  the key SGLang's YAML config files take);
- ``cli_flag``: the flag (``--cuda-graph-max-bs``).

A spelling is matched as a whole token: an identifier or dotted path not running on into a longer name
(``decode_cuda_graph_max_bs`` holds no legacy spelling), a dash form not running on into a longer flag. Where one
spelling runs through several (a symbol's path holds its module's), the longest wins, so each place is one item.

:class:`SpellingSet` also holds the *anchors*: a few short substrings, chosen so that every spelling contains one.
Finding every occurrence of the anchors with ``str.find`` (C speed) and reading the token around each is how a
file is scanned without a regular expression of a hundred alternatives over every byte.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from .renames import Rename, RenameKind, RenameTable
from .table_cache import per_table

__all__ = [
    "TOKEN_CHARACTERS",
    "LegacySpelling",
    "SpellingForm",
    "SpellingSet",
    "covering_anchors",
    "legacy_spellings",
    "spellings_of",
]

TOKEN_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
"""What a token is made of: identifiers, dotted paths and dash-separated flags."""


class SpellingForm:
    """How a spelling is written (the inventory's words for it)."""

    MODULE = "module path"
    SYMBOL = "qualified name"
    NAME = "name"
    OPTION = "option name"
    OPTION_DASHED = "option name (dash form)"
    FLAG = "flag"


@dataclass(frozen=True)
class LegacySpelling:
    """One way a legacy name is written, with what replaces it."""

    text: str
    """The spelling as it appears in a file."""
    form: str
    """A :class:`SpellingForm` value."""
    new: str
    """The new spelling (several joined with `` + `` where one legacy switch became several)."""
    row: Rename
    """The table row it comes from."""
    still_shipped: bool = False
    """The legacy engine's newest release still ships it (a still-shipped module and its names): legacy only in a
    file that also uses a retired legacy module."""

    @property
    def dotted(self) -> bool:
        """Whether the spelling is a dotted path."""
        return "." in self.text


@dataclass(frozen=True)
class SpellingSet:
    """The table's spellings, by text, with the anchors every one of them contains."""

    by_text: Mapping[str, LegacySpelling]
    anchors: tuple[str, ...]
    longest_dotted: int
    """The most parts a dotted spelling has."""
    engine_packages: frozenset[str] = frozenset()
    """The top-level packages of the legacy engines (``sglang``, ``pymllm``): those of the legacy modules not ours."""

    def __iter__(self) -> Iterator[LegacySpelling]:
        return iter(self.by_text.values())

    def __len__(self) -> int:
        return len(self.by_text)

    def mentioned_in(self, text: str) -> bool:
        """Whether ``text`` holds an anchor: False means it holds no legacy spelling (the cheap test first)."""
        return any(anchor in text for anchor in self.anchors)


def spellings_of(row: Rename, still_shipped_modules: frozenset[str]) -> Iterator[LegacySpelling]:
    """The spellings one row gives its old name."""
    new = " + ".join(row.targets) if row.kind in (RenameKind.KWARG, RenameKind.CLI_FLAG) else row.new
    if row.value is not None:
        new = f"{new} {row.value}" if row.kind is RenameKind.CLI_FLAG else f"{new}={row.value!r}"
    if row.kind is RenameKind.MODULE:
        yield LegacySpelling(row.old, SpellingForm.MODULE, row.new, row, row.still_shipped)
    elif row.kind is RenameKind.SYMBOL:
        shipped = row.old_module in still_shipped_modules
        yield LegacySpelling(row.old, SpellingForm.SYMBOL, row.new, row, shipped)
        if row.old_name != row.new_name:
            yield LegacySpelling(row.old_name, SpellingForm.NAME, row.new_name, row, shipped)
    elif row.kind is RenameKind.KWARG:
        yield LegacySpelling(row.old, SpellingForm.OPTION, new, row)
        dashed_new = " + ".join(target.replace("_", "-") for target in row.targets)
        yield LegacySpelling(row.old.replace("_", "-"), SpellingForm.OPTION_DASHED, dashed_new, row)
    elif row.kind is RenameKind.CLI_FLAG:
        yield LegacySpelling(row.old, SpellingForm.FLAG, new, row)
    else:
        yield LegacySpelling(row.old, SpellingForm.NAME, row.new, row)


def legacy_spellings(table: RenameTable) -> SpellingSet:
    """Every spelling of ``table``'s old names (the first row to spell a text wins: several symbol rows spell one
    bare name, ``CudaGraphRunner`` of SGLang's, pymllm's and the shims' module, with one new name)."""
    return _spelling_set(table)


@per_table
def _spelling_set(table: RenameTable) -> SpellingSet:
    still_shipped = frozenset(row.old for row in table.of_kind(RenameKind.MODULE) if row.still_shipped)
    by_text: dict[str, LegacySpelling] = {}
    for row in table:
        for spelling in spellings_of(row, still_shipped):
            known = by_text.get(spelling.text)
            if known is None or (known.still_shipped and not spelling.still_shipped):
                by_text[spelling.text] = spelling
    longest = max((spelling.text.count(".") + 1 for spelling in by_text.values()), default=1)
    packages = frozenset(
        row.old.partition(".")[0] for row in table.of_kind(RenameKind.MODULE) if not row.old.startswith("cudagraph.")
    )
    return SpellingSet(by_text, covering_anchors(tuple(by_text)), longest, packages)


def covering_anchors(texts: tuple[str, ...], length: int = 10) -> tuple[str, ...]:
    """A small set of substrings such that every text contains one (greedy set cover over the texts' substrings of
    ``length`` characters, a shorter text being its own anchor). Ten characters keep them rare in real code: four
    picked ``torc`` and ``raph``, which nearly every file of an inference engine holds."""
    uncovered = set(texts)
    anchors: list[str] = []
    while uncovered:
        counts: dict[str, int] = {}
        for text in uncovered:
            if len(text) <= length:
                counts[text] = counts.get(text, 0) + len(uncovered)  # only itself can anchor it
                continue
            for piece in {text[i : i + length] for i in range(len(text) - length + 1)}:
                counts[piece] = counts.get(piece, 0) + 1
        best = max(counts, key=lambda piece: (counts[piece], piece))
        anchors.append(best)
        uncovered = {text for text in uncovered if best not in text}
    return tuple(anchors)
