"""The generated per-row cases: each migrates exactly to the text spelled from its rows, that text parses and
migrates to itself, and every module and symbol row of the table is exercised by one."""

from __future__ import annotations

import ast

import libcst as cst
import pytest

from cudagraph.migrate.renames import Rename, RenameKind, load_renames
from cudagraph.migrate.rules.base import FindingKind

from .fixture_cases import covers, discover_cases
from .row_cases import RowCase, row_cases

CASES = row_cases()
TABLE = load_renames()
FIXTURES = discover_cases()
IDS = [case.name for case in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_row_case_migrates_to_expected(case: RowCase) -> None:
    result = case.migrate(case.source)
    assert result.migrated.decode() == case.expected
    assert tuple(str(finding) for finding in result.findings if finding.kind is FindingKind.TODO) == case.notes


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_row_case_expected_output_parses(case: RowCase) -> None:
    cst.parse_module(case.expected)
    ast.parse(case.expected)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_row_case_second_run_changes_nothing(case: RowCase) -> None:
    result = case.migrate(case.expected)
    assert result.migrated.decode() == case.expected
    assert result.edits == {}


def test_row_case_names_are_unique() -> None:
    assert len(set(IDS)) == len(IDS)


@pytest.mark.parametrize(
    "row",
    load_renames().of_kind(RenameKind.MODULE, RenameKind.SYMBOL),
    ids=lambda row: f"{row.kind.value}:{row.old}",
)
def test_every_module_and_symbol_row_has_a_generated_case(row: Rename) -> None:
    pairs = [(case.source, case.expected) for case in CASES]
    if TABLE.modules[row.old_module].still_shipped:  # legacy only beside a retired module: hand-written pairs
        pairs += [(case.source.read_text(), case.expected) for case in FIXTURES]
    assert any(covers(row, source, expected) for source, expected in pairs), f"no generated case exercises {row}"
