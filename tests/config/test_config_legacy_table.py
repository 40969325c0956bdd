"""The legacy flags and backend value spellings are derived from the rename table, and agree with its rows."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from cudagraph.config import (
    LEGACY_BACKEND_VALUES,
    LEGACY_FLAGS,
    MODERN_FLAGS,
    Backend,
    RenameKind,
    RenameTable,
    RenameTableError,
    load_renames,
)
from cudagraph.config.flags import Arity, legacy_flags_from_table, option_dest
from cudagraph.config.legacy_values import legacy_backend_rows

TABLE = load_renames()


def test_every_cli_flag_row_is_one_legacy_flag_in_table_order() -> None:
    rows = TABLE.of_kind(RenameKind.CLI_FLAG)
    assert [flag.option for flag in LEGACY_FLAGS] == [row.old for row in rows]
    for flag, row in zip(LEGACY_FLAGS, rows, strict=True):
        assert flag.replacement == tuple((target, row.value) for target in row.targets)
        assert (flag.deprecated_in, flag.removed_in) == (row.deprecated_in, row.removed_in)
        if row.value is not None:
            assert flag.arity is Arity.SWITCH
        else:
            assert {flag.arity} == {MODERN_FLAGS[target].arity for target in row.targets}


def test_every_legacy_keyword_is_the_kwarg_row_of_its_flag() -> None:
    keywords = TABLE.by_old(RenameKind.KWARG)
    assert set(keywords) == {flag.dest for flag in LEGACY_FLAGS}
    for flag in LEGACY_FLAGS:
        row = keywords[flag.dest]
        assert row.targets == tuple(option_dest(option) for option, _ in flag.replacement)
        assert all(value == row.value for _, value in flag.replacement)


def test_legacy_backend_values_are_the_backend_config_string_rows() -> None:
    rows = [row for row in TABLE.of_kind(RenameKind.CONFIG_STRING) if "cudagraph.config.Backend" in row.owners]
    assert dict(LEGACY_BACKEND_VALUES) == {row.old: Backend(row.new) for row in rows}


def test_the_arities_are_the_ones_the_legacy_flags_always_had() -> None:
    assert {flag.option: flag.arity for flag in LEGACY_FLAGS} == {
        "--disable-cuda-graph": Arity.SWITCH,
        "--disable-piecewise-cuda-graph": Arity.SWITCH,
        "--enable-breakable-cuda-graph": Arity.SWITCH,
        "--enforce-piecewise-cuda-graph": Arity.SWITCH,
        "--cuda-graph-bs": Arity.MANY,
        "--cuda-graph-max-bs": Arity.ONE,
        "--piecewise-cuda-graph-tokens": Arity.MANY,
        "--piecewise-cuda-graph-max-tokens": Arity.ONE,
        "--piecewise-cuda-graph-compiler": Arity.ONE,
    }


def _edited(old: str, kind: RenameKind, **changes: Any) -> RenameTable:
    rows = tuple(replace(row, **changes) if (row.kind, row.old) == (kind, old) else row for row in TABLE)
    return RenameTable(rows=rows, source=TABLE.source)


def _without(old: str, kind: RenameKind) -> RenameTable:
    return RenameTable(rows=tuple(row for row in TABLE if (row.kind, row.old) != (kind, old)), source=TABLE.source)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (_edited("cuda_graph_bs", RenameKind.KWARG, new="prefill_cuda_graph_tokens"), "disagrees with cli_flag"),
        (_edited("enable_breakable_cuda_graph", RenameKind.KWARG, value="tc_piecewise"), "disagrees with cli_flag"),
        (_edited("cuda_graph_max_bs", RenameKind.KWARG, removed_in="2.0.0"), "disagrees with cli_flag"),
        (_without("cuda_graph_bs", RenameKind.KWARG), "has no kwarg row 'cuda_graph_bs'"),
        (_without("--cuda-graph-bs", RenameKind.CLI_FLAG), "have no cli_flag row"),
        (_edited("--cuda-graph-bs", RenameKind.CLI_FLAG, new="--no-such-flag"), "are not modern flags"),
        (
            _edited("--cuda-graph-bs", RenameKind.CLI_FLAG, also=("--decode-cuda-graph-max-bs",)),
            "different numbers of values",
        ),
    ],
)
def test_a_table_the_flags_cannot_be_derived_from_is_rejected(table: RenameTable, message: str) -> None:
    with pytest.raises(RenameTableError, match=message):
        legacy_flags_from_table(table)


def test_a_backend_row_naming_no_backend_is_rejected() -> None:
    table = _edited("tcpcg", RenameKind.CONFIG_STRING, new="piecewise")
    with pytest.raises(RenameTableError, match="'piecewise' is no backend"):
        legacy_backend_rows(table)
