"""Fixture cases under ``fixtures/``: one legacy input ``NAME.in.py`` and its expected outputs, discovered by name.

A first line ``# migrate-fixture: path=some/dir/file.py select=CG1 rewrite-argv=yes`` sets the path the source
pretends to live at (relative imports resolve against it), the rules to run and the run switches (``rewrite-argv``,
``rewrite-engine-options``, ``move-shared-state``: ``yes`` turns one on); by default the path is ``fixtures/NAME.py``,
all rules run, and argv lists and other engines' options are only listed.

One input serves one expected output per option set, and an expected output is stored as what the migration changes
(a unified diff from the input), so a line the migration leaves alone is stored once, in the input:

- ``NAME.out.diff`` is the migration under the header's options; where it is absent, the migration must leave the
  input as it is (the expected output is the input itself).
- ``NAME.SWITCH.out.diff`` (``SWITCH`` one of the run switches) is the migration with that switch turned on as well,
  as the case ``NAME.SWITCH``.

A diff is applied strictly: every context and removed line must stand in the input where the hunk says, so an input
edited without its diff fails by name instead of comparing against a stale output. To write or update one, write the
expected output by hand and store its diff from the input:

    python tests/codemods/fixture_cases.py tests/codemods/fixtures/NAME.in.py EXPECTED.py [SWITCH]
"""

from __future__ import annotations

import difflib
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from cudagraph.migrate.options import RunOptions
from cudagraph.migrate.renames import Rename, RenameKind, load_renames
from cudagraph.migrate.rules import select_rules
from cudagraph.migrate.source_migration import SourceMigration, migrate_source

FIXTURES = Path(__file__).parent / "fixtures"
_HEADER = re.compile(r"#\s*migrate-fixture:(.*)")
_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


SWITCHES = ("rewrite-argv", "rewrite-engine-options", "move-shared-state")
"""The run switches a header (or an expected output's name) turns on."""


class StaleDiff(ValueError):
    """An expected output's diff does not apply to its input (the input changed without it)."""


def diff_from(source: str, expected: str, source_name: str, expected_name: str) -> str:
    """The unified diff that turns ``source`` into ``expected`` (three lines of context), as it is stored."""
    lines = difflib.unified_diff(
        source.splitlines(keepends=True), expected.splitlines(keepends=True), source_name, expected_name
    )
    return "".join(lines)


def apply_diff(source: str, diff: str, name: str = "diff") -> str:
    """``source`` with the unified ``diff`` applied; raises :class:`StaleDiff` where a hunk does not match it.

    An empty line in a hunk reads as an empty context line (editors strip the lone space of one)."""
    source_lines = source.splitlines(keepends=True)
    diff_lines = diff.splitlines(keepends=True)
    out: list[str] = []
    taken = 0  # source lines consumed
    index = next((i for i, line in enumerate(diff_lines) if line.startswith("@@")), len(diff_lines))
    while index < len(diff_lines):
        match = _HUNK.match(diff_lines[index])
        if match is None:
            raise StaleDiff(f"{name}: line {index + 1} is not a hunk header: {diff_lines[index]!r}")
        start = int(match.group(1)) - (match.group(2) != "0")
        old_count = int(match.group(2) or 1)
        new_count = int(match.group(4) or 1)
        if start < taken:
            raise StaleDiff(f"{name}: the hunk at line {index + 1} overlaps the one before it")
        out += source_lines[taken:start]
        taken = start
        index += 1
        while old_count or new_count:
            if index >= len(diff_lines):
                raise StaleDiff(f"{name}: the diff ends inside a hunk")
            line = diff_lines[index]
            tag, text = (" ", line) if line in ("\n", "\r\n") else (line[0], line[1:])
            if tag in " -":
                if taken >= len(source_lines) or source_lines[taken] != text:
                    found = source_lines[taken] if taken < len(source_lines) else "the end of the input"
                    raise StaleDiff(f"{name}: line {taken + 1} of the input is {found!r}, the diff expects {text!r}")
                taken += 1
                old_count -= 1
            if tag in " +":
                out.append(text)
                new_count -= 1
            if tag not in " -+":
                raise StaleDiff(f"{name}: line {index + 1} is not a context, removed or added line: {line!r}")
            index += 1
    return "".join(out + source_lines[taken:])


def expected_diff_path(source: Path, switch: str | None = None) -> Path:
    """Where the expected output of ``source`` (``NAME.in.py``) under ``switch`` is stored."""
    stem = source.name.removesuffix(".in.py")
    return source.with_name(f"{stem}.{switch}.out.diff" if switch else f"{stem}.out.diff")


def expected_text(source: Path, switch: str | None = None) -> str:
    """The expected output of ``source`` under ``switch``: its stored diff applied, or the input where none is."""
    text = source.read_text()
    diff = expected_diff_path(source, switch)
    return apply_diff(text, diff.read_text(), diff.name) if diff.exists() else text


@dataclass(frozen=True)
class FixtureCase:
    """One input with one expected output: the migration under one option set."""

    name: str
    source: Path
    switch: str | None = None
    """A run switch turned on beyond the header's (the ``SWITCH`` of ``NAME.SWITCH.out.diff``)."""

    @property
    def expected(self) -> str:
        """The expected migration of the input under this case's options."""
        return expected_text(self.source, self.switch)

    @property
    def options(self) -> dict[str, str]:
        """``key=value`` settings from the header line, with this case's switch on."""
        first_line = self.source.read_text().splitlines()[0]
        match = _HEADER.match(first_line)
        options = dict(item.split("=", 1) for item in match.group(1).split()) if match else {}
        return options | ({self.switch: "yes"} if self.switch else {})

    @property
    def stem(self) -> str:
        """The input's name, shared by every case of one input."""
        return self.source.name.removesuffix(".in.py")

    @property
    def virtual_path(self) -> str:
        """The path the source is migrated as."""
        return self.options.get("path", f"fixtures/{self.stem}.py")

    def migrate(self, text: str, *, rewrite_argv: bool | None = None) -> SourceMigration:
        """Migrate ``text`` as this fixture's file with this fixture's rules (``rewrite_argv`` overrides its switch)."""
        select = [code for code in self.options.get("select", "").split(",") if code]
        options = RunOptions(
            rewrite_argv=self.options.get("rewrite-argv") == "yes" if rewrite_argv is None else rewrite_argv,
            rewrite_engine_options=self.options.get("rewrite-engine-options") == "yes",
            move_shared_state=self.options.get("move-shared-state") == "yes",
        )
        return migrate_source(text, self.virtual_path, select_rules(select), load_renames(), options)


def discover_cases() -> list[FixtureCase]:
    """Every ``*.in.py`` under ``fixtures/`` with each of its expected outputs (itself where none is stored)."""
    cases = []
    for source in sorted(FIXTURES.glob("*.in.py")):
        stem = source.name.removesuffix(".in.py")
        cases.append(FixtureCase(stem, source))
        cases.extend(
            FixtureCase(f"{stem}.{switch}", source, switch)
            for switch in SWITCHES
            if expected_diff_path(source, switch).exists()
        )
    return cases


def expected_outputs() -> set[str]:
    """The names of the stored expected outputs, as ``NAME`` or ``NAME.SWITCH``: each must belong to an input."""
    return {path.name.removesuffix(".out.diff") for path in FIXTURES.glob("*.out.diff")}


def fixture_texts() -> dict[str, str]:
    """Every Python text the fixtures hold, by name: each input (``NAME.in.py``) and each expected output
    (``NAME.out.py``, ``NAME.SWITCH.out.py``), as the tests that read any fixture source take them."""
    texts = {path.name: path.read_text() for path in sorted(FIXTURES.glob("*.in.py"))}
    for case in discover_cases():
        if expected_diff_path(case.source, case.switch).exists():
            texts[f"{case.name}.out.py"] = case.expected
    return texts


LEGACY = FIXTURES / "kwargs.in.py"
"""The legacy file the command-line tests migrate: keywords of every kind, two left for the user."""
MIGRATED = expected_text(LEGACY)
"""What the migration writes for ``LEGACY``."""
UNPARSABLE = FIXTURES / "unparsable.bad.py"
"""A file the migration must report and leave as it is."""


def project_of(root: Path, files: dict[str, str]) -> Path:
    """A project at ``root`` holding, at each relative path of ``files``, a copy of the fixture file it names."""
    for relative, fixture in files.items():
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / fixture, target)
    return root


def covers(row: Rename, source: str, expected: str) -> bool:
    """Whether a source and its expected migration exercise ``row``: its old spelling in, its new spelling out."""
    if row.kind is RenameKind.MODULE:
        still_imported = re.search(rf"(import|from)\s+{re.escape(row.old)}\b", expected)
        return row.old in source and row.new in expected and not still_imported
    if row.kind is RenameKind.SYMBOL:
        return (
            row.old_module in source
            and bool(_word(row.old_name).search(source))
            and row.new_module in expected
            and bool(_word(row.new_name).search(expected))
        )
    return bool(_word(row.old).search(source)) and all(_word(target).search(expected) for target in row.targets)


def _word(text: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w\-]){re.escape(text)}(?![\w\-])")


def _store_expected(argv: list[str]) -> None:
    """``fixture_cases.py NAME.in.py EXPECTED.py [SWITCH]``: store ``EXPECTED.py`` as that input's expected diff."""
    source, expected = Path(argv[0]), Path(argv[1])
    switch = argv[2] if len(argv) > 2 else None
    if switch is not None and switch not in SWITCHES:
        raise SystemExit(f"unknown switch {switch!r}: one of {', '.join(SWITCHES)}")
    target = expected_diff_path(source, switch)
    target.write_text(
        diff_from(source.read_text(), expected.read_text(), source.name, target.name[: -len(".diff")] + ".py")
    )
    print(f"wrote {target}")


if __name__ == "__main__":
    _store_expected(sys.argv[1:])
