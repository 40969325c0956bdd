"""Where legacy spellings occur in a text: tokens around the spelling set's anchors, and Python's strings and comments.

Two readers, both independent of the interpreter running the tool:

- :func:`spelling_tokens` finds every token of a text (an identifier, a dotted path, a dash-separated flag) that is
  a legacy spelling, by looking only around the occurrences of the set's anchors;
- :func:`python_spans` reads Python's lexical structure (comments, string literals of every prefix, f-strings with
  nested quotes and replacement fields as PEP 701 allows): enough to tell code from a string from a comment, and to
  put adjacent (or ``+``-joined) literals together into the string they make. It parses nothing, so no grammar of
  any Python version decides what it can read.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .spellings import TOKEN_CHARACTERS, LegacySpelling, SpellingSet

__all__ = ["PythonSpans", "SpellingHit", "StringPiece", "line_starts", "position", "python_spans", "spelling_tokens"]


@dataclass(frozen=True)
class SpellingHit:
    """One occurrence of a legacy spelling: where it starts in the text and which spelling it is."""

    offset: int
    spelling: LegacySpelling


def spelling_tokens(text: str, spellings: SpellingSet) -> list[SpellingHit]:
    """Every legacy spelling of ``text`` as a whole token, in order; each place once (the longest dotted spelling
    through a place wins over the shorter ones it holds)."""
    runs: set[tuple[int, int]] = set()
    size = len(text)
    for anchor in spellings.anchors:
        found = text.find(anchor)
        while found != -1:
            start, end = found, found + len(anchor)
            while start > 0 and text[start - 1] in TOKEN_CHARACTERS:
                start -= 1
            while end < size and text[end] in TOKEN_CHARACTERS:
                end += 1
            runs.add((start, end))
            found = text.find(anchor, end)
    hits: list[SpellingHit] = []
    for start, end in sorted(runs):
        hits.extend(_run_hits(text[start:end], start, spellings))
    return hits


def _run_hits(run: str, start: int, spellings: SpellingSet) -> Iterator[SpellingHit]:
    by_text = spellings.by_text
    trimmed = run.rstrip(".-")
    if "-" in trimmed:
        whole = by_text.get(trimmed)
        if whole is None:
            bare = trimmed.lstrip("-")
            whole = by_text.get(bare) if "-" in bare else None
            if whole is not None:
                yield SpellingHit(start + len(trimmed) - len(bare), whole)
                return
        else:
            yield SpellingHit(start, whole)
            return
    for segment_start, segment in _pieces(run, "-", start):
        parts = list(_pieces(segment, ".", segment_start))
        index = 0
        while index < len(parts):
            for stop in range(min(len(parts), index + spellings.longest_dotted), index, -1):
                candidate = ".".join(part for _, part in parts[index:stop])
                spelling = by_text.get(candidate)
                if spelling is not None and "-" not in spelling.text:
                    yield SpellingHit(parts[index][0], spelling)
                    index = stop
                    break
            else:
                index += 1


def _pieces(text: str, separator: str, start: int) -> Iterator[tuple[int, str]]:
    offset = start
    for piece in text.split(separator):
        yield offset, piece
        offset += len(piece) + 1


@dataclass(frozen=True)
class StringPiece:
    """One string literal: the whole token (prefix and quotes included) and its content between the quotes."""

    start: int
    end: int
    content_start: int
    content_end: int


@dataclass
class PythonSpans:
    """A Python text's comments and string literals, in order, and the literals grouped as the strings they make."""

    comments: list[tuple[int, int]]
    strings: list[StringPiece]
    groups: list[list[StringPiece]]
    """Runs of literals that make one string: adjacent, or joined with ``+``."""

    def __post_init__(self) -> None:
        self._comment_starts = [start for start, _ in self.comments]
        self._string_starts = [piece.start for piece in self.strings]

    def in_comment(self, offset: int) -> bool:
        """Whether ``offset`` lies in a comment."""
        index = bisect.bisect_right(self._comment_starts, offset) - 1
        return index >= 0 and offset < self.comments[index][1]

    def in_string(self, offset: int) -> bool:
        """Whether ``offset`` lies in a string literal."""
        index = bisect.bisect_right(self._string_starts, offset) - 1
        return index >= 0 and offset < self.strings[index].end


_PREFIX_LETTERS = frozenset("rRbBuUfFtT")
_SIMPLE_BODY = {
    "'": re.compile(r"(?:[^'\\\n]|\\.|\\\n)*'"),
    '"': re.compile(r'(?:[^"\\\n]|\\.|\\\n)*"'),
    "'''": re.compile(r"(?:[^\\]|\\.)*?'''", re.DOTALL),
    '"""': re.compile(r'(?:[^\\]|\\.)*?"""', re.DOTALL),
}
_START = re.compile(r"""#|'''|\"\"\"|'|\"""")
_JOIN = re.compile(r"(?:\s|\\\n|\+)*")


def python_spans(text: str) -> PythonSpans:
    """The comments and string literals of the Python ``text`` (a literal left open runs to the end)."""
    comments: list[tuple[int, int]] = []
    strings: list[StringPiece] = []
    position_ = 0
    while True:
        match = _START.search(text, position_)
        if match is None:
            break
        start = match.start()
        if match.group() == "#":
            end = text.find("\n", start)
            end = len(text) if end == -1 else end
            comments.append((start, end))
            position_ = end
            continue
        piece = _string_at(text, start, match.group())
        strings.append(piece)
        position_ = piece.end
    return PythonSpans(comments, strings, _groups(text, strings, comments))


def _string_at(text: str, quote_start: int, quote: str) -> StringPiece:
    prefix_start = quote_start
    while prefix_start > 0 and quote_start - prefix_start < 3 and text[prefix_start - 1] in _PREFIX_LETTERS:
        prefix_start -= 1
    if prefix_start > 0 and (text[prefix_start - 1].isalnum() or text[prefix_start - 1] == "_"):
        prefix_start = quote_start  # letters of a name, not a prefix
    prefix = text[prefix_start:quote_start].lower()
    content_start = quote_start + len(quote)
    if "f" in prefix or "t" in prefix:
        end = _formatted_end(text, content_start, quote, raw="r" in prefix)
    else:
        body = _SIMPLE_BODY[quote].match(text, content_start)
        end = body.end() if body is not None else len(text)
    closed = text.endswith(quote, 0, end) and end - len(quote) >= content_start
    content_end = end - len(quote) if closed else end
    return StringPiece(prefix_start, end, content_start, content_end)


def _formatted_end(text: str, index: int, quote: str, *, raw: bool) -> int:
    """Where the f-string whose content starts at ``index`` ends (after its closing quote): replacement fields may
    hold strings with any quotes, nested f-strings and further fields (PEP 701)."""
    size = len(text)
    depth = 0
    while index < size:
        char = text[index]
        if depth == 0:
            if text.startswith(quote, index):
                return index + len(quote)
            if char == "\\" and not raw:
                index += 2
                continue
            if char == "\n" and len(quote) == 1:
                return index  # left open: ends at the line
            if char == "{":
                if text.startswith("{{", index):
                    index += 2
                    continue
                depth = 1
            index += 1
            continue
        if char in "'\"":
            nested_quote = text[index : index + 3] if text[index : index + 3] in ("'''", '"""') else char
            index = _string_at(text, index, nested_quote).end
            continue
        if char == "#":
            newline = text.find("\n", index)
            index = size if newline == -1 else newline
            continue
        if char in "{[(":
            depth += 1
        elif char in "}])":
            depth -= 1
        index += 1
    return size


def _groups(text: str, strings: Sequence[StringPiece], comments: Sequence[tuple[int, int]]) -> list[list[StringPiece]]:
    groups: list[list[StringPiece]] = []
    comment_index = 0
    for piece in strings:
        if groups:
            previous = groups[-1][-1]
            gap_start = previous.end
            while comment_index < len(comments) and comments[comment_index][1] <= gap_start:
                comment_index += 1
            if _joins(text, gap_start, piece.start, comments, comment_index):
                groups[-1].append(piece)
                continue
        groups.append([piece])
    return groups


def _joins(text: str, start: int, end: int, comments: Sequence[tuple[int, int]], comment_index: int) -> bool:
    """Whether only blanks, line continuations, comments and at most one ``+`` separate two literals."""
    cursor = start
    while comment_index < len(comments) and comments[comment_index][0] < end:
        comment_start, comment_end = comments[comment_index]
        if _JOIN.fullmatch(text, cursor, comment_start) is None:
            return False
        cursor = comment_end
        comment_index += 1
    return _JOIN.fullmatch(text, cursor, end) is not None and text.count("+", start, end) <= 1


def line_starts(text: str) -> list[int]:
    """The offset of each line's first character."""
    starts = [0]
    found = text.find("\n")
    while found != -1:
        starts.append(found + 1)
        found = text.find("\n", found + 1)
    return starts


def position(starts: Sequence[int], offset: int) -> tuple[int, int]:
    """1-based (line, column) of ``offset``."""
    line = bisect.bisect_right(starts, offset)
    return line, offset - starts[line - 1] + 1
