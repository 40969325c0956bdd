"""Fixture pairs under ``fixtures/``: ``NAME.in.py`` (legacy) and ``NAME.out.py`` (expected), discovered by name.

A first line ``# migrate-fixture: path=some/dir/file.py select=CG1 rewrite-argv=yes`` sets the path the source
pretends to live at (relative imports resolve against it), the rules to run and the run switches (``rewrite-argv``,
``rewrite-engine-options``, ``move-shared-state``: ``yes`` turns one on); by default the path is ``fixtures/NAME.py``,
all rules run, and argv lists and other engines' options are only listed.
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


@dataclass(frozen=True)
class FixtureCase:
    """One fixture pair."""

    name: str
    source: Path
    expected: Path

    @property
    def options(self) -> dict[str, str]:
        """``key=value`` settings from the header line."""
        first_line = self.source.read_text().splitlines()[0]
        match = _HEADER.match(first_line)
        return dict(item.split("=", 1) for item in match.group(1).split()) if match else {}

    @property
    def virtual_path(self) -> str:
        """The path the source is migrated as."""
        return self.options.get("path", f"fixtures/{self.name}.py")

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
    """Every ``*.in.py`` under ``fixtures/`` with its ``.out.py``."""
    return [
        FixtureCase(path.name.removesuffix(".in.py"), path, path.with_name(path.name.replace(".in.py", ".out.py")))
        for path in sorted(FIXTURES.glob("*.in.py"))
    ]


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
