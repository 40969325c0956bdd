"""Fixture cases under ``fixtures/``: one legacy input ``NAME.in.py`` and its expected outputs, discovered by name.

A first line ``# migrate-fixture: path=some/dir/file.py select=CG1 rewrite-argv=yes`` sets the path the source
pretends to live at (relative imports resolve against it), the rules to run and the run switches (``rewrite-argv``,
``rewrite-engine-options``, ``move-shared-state``: ``yes`` turns one on); by default the path is ``fixtures/NAME.py``,
all rules run, and argv lists and other engines' options are only listed.

One input serves one expected output per option set, so the same input is stored once:

- ``NAME.out.py`` is the migration under the header's options; where it is absent, the migration must leave the
  input as it is (the expected output is the input itself).
- ``NAME.SWITCH.out.py`` (``SWITCH`` one of the run switches) is the migration with that switch turned on as well,
  as the case ``NAME.SWITCH``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from cudagraph.migrate.options import RunOptions
from cudagraph.migrate.renames import Rename, RenameKind, load_renames
from cudagraph.migrate.rules import select_rules
from cudagraph.migrate.source_migration import SourceMigration, migrate_source

FIXTURES = Path(__file__).parent / "fixtures"
_HEADER = re.compile(r"#\s*migrate-fixture:(.*)")


SWITCHES = ("rewrite-argv", "rewrite-engine-options", "move-shared-state")
"""The run switches a header (or an expected output's name) turns on."""


@dataclass(frozen=True)
class FixtureCase:
    """One input with one expected output: the migration under one option set."""

    name: str
    source: Path
    expected: Path
    switch: str | None = None
    """A run switch turned on beyond the header's (the ``SWITCH`` of ``NAME.SWITCH.out.py``)."""

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
        expected = source.with_name(f"{stem}.out.py")
        cases.append(FixtureCase(stem, source, expected if expected.exists() else source))
        cases.extend(
            FixtureCase(f"{stem}.{switch}", source, source.with_name(f"{stem}.{switch}.out.py"), switch)
            for switch in SWITCHES
            if source.with_name(f"{stem}.{switch}.out.py").exists()
        )
    return cases


def expected_outputs() -> set[str]:
    """The names of the stored expected outputs, as ``NAME`` or ``NAME.SWITCH``: each must belong to an input."""
    return {path.name.removesuffix(".out.py") for path in FIXTURES.glob("*.out.py")}


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
