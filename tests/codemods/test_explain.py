"""``cudagraph-migrate --explain CODE`` prints a rule's manual steps from the guide the tool ships; every TODO names
that command with the code of the rule that wrote it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from cudagraph.migrate import guide
from cudagraph.migrate.command import EXIT_OK, EXIT_USAGE, main
from cudagraph.migrate.rules import RULES
from cudagraph.migrate.rules.base import MigrationCommand
from cudagraph.migrate.todo_comments import GuideSection, todo_comments_in

from .fixture_cases import discover_cases

GUIDE_TEXT = guide.guide_path().read_text(encoding="utf-8")


def test_explain_prints_the_rules_manual_steps(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--explain", "CG101"]) == EXIT_OK
    printed = capsys.readouterr().out
    assert printed.startswith("CG101 legacy-imports: imports of legacy modules and symbols")
    assert "### Calls the new API does not accept\n" in printed
    assert "### Subclasses of the legacy runners\n" in printed
    assert "### Members of engine classes that are not ours" not in printed  # CG201's, not CG101's
    _, sections = guide.manual_steps(GUIDE_TEXT)
    assert sections["calls-the-new-api-does-not-accept"] in printed  # the guide's text, whole


def test_explain_of_a_rule_without_manual_steps_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--explain", "cg301"]) == EXIT_OK
    assert "CG301 rewrites every place it finds: it leaves no manual step" in capsys.readouterr().out


def test_explain_of_an_unknown_code_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--explain", "CG999"]) == EXIT_USAGE
    assert capsys.readouterr().err.startswith("cudagraph-migrate: error: --explain: no rule 'CG999'; rules are CG101")


def test_the_console_script_explains() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cudagraph.migrate.command", "--explain", "CG201"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "### Members of engine classes that are not ours" in result.stdout


def test_every_rule_has_its_sections_and_each_is_in_the_guide() -> None:
    _, sections = guide.manual_steps(GUIDE_TEXT)
    assert set(guide.RULE_SECTIONS) == {rule.code for rule in RULES}
    named = {section for wanted in guide.RULE_SECTIONS.values() for section in wanted}
    assert {section.value for section in named} <= set(sections)
    assert {section.value for section in GuideSection} - {GuideSection.MANUAL_STEPS.value} <= set(sections)


def test_every_todo_a_rule_writes_points_to_a_section_its_explain_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run every fixture, record which section each rule's TODO is about: ``--explain`` of that rule prints it."""
    seen: set[tuple[str, GuideSection]] = set()
    note = MigrationCommand.note

    def recording(self: MigrationCommand, node, message, section=GuideSection.MANUAL_STEPS) -> None:  # type: ignore[no-untyped-def]
        seen.add((self.CODE, section))
        note(self, node, message, section)

    monkeypatch.setattr(MigrationCommand, "note", recording)
    todos = []
    for case in discover_cases():
        if "TODO(cudagraph-migrate)" not in case.expected:
            continue
        todos += todo_comments_in(case.migrate(case.source.read_text()).migrated.decode())
    assert len(seen) > 10
    missing = {
        (code, section)
        for code, section in seen
        if section is not GuideSection.MANUAL_STEPS and section not in guide.RULE_SECTIONS[code]
    }
    assert missing == set()
    assert todos and all(re.search(r" — see cudagraph-migrate --explain CG\d{3}$", todo) for todo in todos)
